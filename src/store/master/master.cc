#include "store/master/master.h"

#include <algorithm>
#include <functional>

#include "common/log.h"
#include "store/master/master_util.h"

namespace ferry::store {

Master::Master(MasterOptions options)
    : options_(std::move(options)),
      term_(options_.term),
      awaited_(options_.awaited_nodes.begin(), options_.awaited_nodes.end()),
      rebuilt_by_(Clock::now() + options_.node_ttl) {
  rebuilding_ = !awaited_.empty();
  const int n = std::max(1, options_.shards);
  for (int i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
  ticker_ = std::make_unique<Ticker>("ferry-master", options_.tick, [this](bool) { Tick(); });
  ticker_->Start();
}

Master::~Master() {
  log_.Close();
  ticker_.reset();
}

Status Master::CheckKey(std::string_view key) { return store::CheckKey(key); }

Master::Shard& Master::ShardOf(const std::string& key) {
  return *shards_[std::hash<std::string>{}(key) % shards_.size()];
}

void Master::Close() { log_.Close(); }

void Master::AwaitCatalog(const std::vector<Queued>& queued) {
  if (options_.catalog_sync.count() <= 0 || queued.empty()) return;
  const auto deadline = Clock::now() + options_.catalog_sync;
  uint64_t late = 0;
  for (const Queued& q : queued) {
    if (!log_.WaitApplied(q.node, q.generation, q.seq, deadline)) ++late;
  }
  if (late > 0) {
    FERRY_COUNT(catalog_sync_timeouts, 1);
    FERRY_LOG_DEBUG("master: {} catalog changes not applied within {} ms", late,
                    options_.catalog_sync.count());
  }
}

Status Master::SetTerm(uint64_t t) {
  uint64_t cur = term_.load();
  while (t >= cur) {
    if (term_.compare_exchange_weak(cur, t)) return Status::Ok();
  }
  return Status::InvalidArgument("term " + std::to_string(t) + " is below the current " +
                                 std::to_string(cur));
}

void Master::FreeLater(std::vector<Allocation> replicas, Clock::time_point until) {
  if (until <= Clock::now()) {
    for (const auto& a : replicas) space_.Free(a);
    return;
  }
  std::lock_guard lock(deferred_mu_);
  for (auto& a : replicas) {
    deferred_bytes_ += Bytes(a);
    deferred_.push_back({std::move(a), until});
  }
}

CatalogEntry Master::EntryOf(const std::string& key, const Object& o, const Allocation& a) const {
  CatalogEntry e{key, o.size, {}, o.pin, Millis(0), o.term, o.put_id};
  for (const Extent& x : a.extents) e.extents.emplace_back(x.addr, x.length);
  const auto now = Clock::now();
  if (o.pin_until > now) e.pin_ttl = std::chrono::duration_cast<Millis>(o.pin_until - now);
  return e;
}

void Master::Tell(const std::string& key, const Object& o, bool forget,
                  std::vector<Queued>* queued) {
  for (const Allocation& a : o.replicas) {
    const uint64_t seq = log_.Add(a.node, a.generation, forget, EntryOf(key, o, a));
    if (queued != nullptr && seq != 0) queued->push_back({a.node, a.generation, seq});
  }
}

// The space is reused without waiting for the nodes to forget the object: a
// node checksums an object when it lists it and drops the entry at its next
// mount if the bytes no longer match, so reused space does not come back as
// the object (docs/store.md says where that falls short).
void Master::FreeLater(const std::string& key, Object& o, Clock::time_point until,
                       std::vector<Queued>* queued) {
  if (o.complete) Tell(key, o, /*forget=*/true, queued);
  FreeLater(std::move(o.replicas), until);
}

// The replicas as clients address them: each extent names its node.
static std::vector<StoreReplica> Replicas(const std::vector<Allocation>& allocations) {
  std::vector<StoreReplica> out(allocations.size());
  for (size_t r = 0; r < allocations.size(); ++r) {
    out[r].epoch = allocations[r].epoch;
    for (const Extent& e : allocations[r].extents) {
      out[r].extents.push_back({allocations[r].node, e.addr, e.length});
    }
  }
  return out;
}

Result<PutGrant> Master::PutBegin(const PutSpec& spec, const std::string& client_node) {
  if (spec.reserve) {
    if (!spec.key.empty()) return Status::InvalidArgument("a reservation has no key");
  } else {
    FERRY_RETURN_IF_ERROR(CheckKey(spec.key));
  }
  if (spec.size == 0 || spec.size > options_.max_object_size) {
    return Status::InvalidArgument("size " + std::to_string(spec.size) + " outside 1.." +
                                   std::to_string(options_.max_object_size));
  }
  if (spec.replicas == 0 || spec.replicas > options_.max_replicas) {
    return Status::InvalidArgument("replicas must be 1.." + std::to_string(options_.max_replicas));
  }
  Shard& shard = ShardOf(spec.key);
  if (!spec.reserve) {
    std::lock_guard lock(shard.mu);
    auto it = shard.objects.find(spec.key);
    if (it != shard.objects.end()) {
      if (it->second.complete) return Status::AlreadyExists("key exists");
      return Status::Busy("another put of this key is open");
    }
  }
  if (spec.reserve) {
    // Nor would background eviction make room for it.
    const SpaceUsage u = space_.Usage();
    if (static_cast<double>(u.used + OffsetAllocator::RoundUp(spec.size) * spec.replicas) >
        options_.high_watermark * static_cast<double>(u.capacity)) {
      return Status::ResourceExhausted("a reservation would pass the high watermark");
    }
  }
  Placement p{spec.size, spec.replicas, spec.preferred.empty() ? client_node : spec.preferred};
  auto alloc = space_.Allocate(p);
  // Never "no space" while evictable data exists: evict synchronously, retry.
  // A reservation is made ahead of need, and takes free space only.
  if (!spec.reserve && !alloc.ok() && alloc.status().code() == StatusCode::kResourceExhausted) {
    // Before objects; their space comes back after the write grace.
    if (DropReservations() > 0) alloc = space_.Allocate(p);
  }
  while (!spec.reserve && !alloc.ok() && alloc.status().code() == StatusCode::kResourceExhausted) {
    FERRY_COUNT(sync_evictions, 1);
    if (Evict(OffsetAllocator::RoundUp(spec.size) * spec.replicas, /*soft=*/true) == 0) break;
    alloc = space_.Allocate(p);
  }
  if (!alloc.ok()) {
    if (alloc.status().code() != StatusCode::kResourceExhausted) return alloc.status();
    const MasterStats st = Stats();
    return Status::ResourceExhausted(
        fmt::format("{}: {} of {} bytes in use, {} fenced by leases or write grace, "
                    "nothing evictable",
                    alloc.status().message(), st.space.used, st.space.capacity, st.deferred_bytes));
  }
  const auto now = Clock::now();
  Object obj;
  obj.size = spec.size;
  obj.replicas = alloc.value();
  obj.put_id = next_put_id_++;
  obj.put_deadline = now + options_.put_timeout;
  obj.last_access = now;
  obj.pin = spec.pin;
  obj.pin_until = now + spec.pin_ttl;
  obj.term = term();
  if (spec.reserve) {
    std::lock_guard lock(reserved_mu_);
    reserved_.emplace(obj.put_id, obj);
    FERRY_COUNT(reserved, 1);
    return PutGrant{obj.put_id, Replicas(alloc.value()), options_.put_timeout};
  }
  {
    std::lock_guard lock(shard.mu);
    auto [it, inserted] = shard.objects.try_emplace(spec.key, obj);
    if (!inserted) {  // lost a race with another put of the same key
      FreeLater(std::move(obj.replicas), now);
      return Status::Busy("another put of this key is open");
    }
    ++objects_;
  }
  FERRY_COUNT(puts_begun, 1);
  return PutGrant{obj.put_id, Replicas(alloc.value()), options_.put_timeout};
}

Status Master::PutEnd(const std::string& key, uint64_t put_id, bool commit, bool reserved) {
  return PutEnd(std::vector<store::PutEnd>{{key, put_id, commit, reserved}})[0];
}

std::vector<Status> Master::PutEnd(const std::vector<store::PutEnd>& items) {
  std::vector<Queued> queued;
  std::vector<Status> out;
  out.reserve(items.size());
  for (const auto& i : items) {
    out.push_back(i.reserved ? CommitReserved(i.key, i.put_id, i.commit, &queued)
                             : PutEndOne(i.key, i.put_id, i.commit, &queued));
  }
  AwaitCatalog(queued);
  return out;
}

Status Master::PutEndOne(const std::string& key, uint64_t put_id, bool commit,
                         std::vector<Queued>* queued) {
  FERRY_RETURN_IF_ERROR(CheckKey(key));
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  const auto now = Clock::now();
  if (it == shard.objects.end() || it->second.complete || it->second.put_id != put_id) {
    return Status::NotFound("no open put " + std::to_string(put_id) +
                            " of this key (expired, aborted or node lost)");
  }
  if (commit && now < it->second.put_deadline) {
    it->second.complete = true;
    it->second.last_access = now;
    Tell(key, it->second, /*forget=*/false, queued);
    FERRY_COUNT(puts_committed, 1);
    return Status::Ok();
  }
  FreeLater(std::move(it->second.replicas), now + options_.write_grace);
  shard.objects.erase(it);
  --objects_;
  FERRY_COUNT(puts_aborted, 1);
  if (commit) return Status::Timeout("the put expired before its commit");
  return Status::Ok();
}

Result<GetGrant> Master::Get(const std::string& key) {
  FERRY_RETURN_IF_ERROR(CheckKey(key));
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  if (it == shard.objects.end() || !it->second.complete) {
    FERRY_RETURN_IF_ERROR(MissIsSure());
    FERRY_COUNT(get_misses, 1);
    return Status::NotFound("no such key");
  }
  const auto now = Clock::now();
  const uint64_t lease_id = next_lease_id_++;
  (void)it->second.LeaseEnd(now);  // drop ended leases before adding one
  it->second.leases.emplace_back(lease_id, now + options_.lease);
  it->second.last_access = now;
  FERRY_COUNT(gets, 1);
  return GetGrant{{it->second.size, Replicas(it->second.replicas), options_.lease}, lease_id};
}

Status Master::ReleaseLease(const std::string& key, uint64_t lease_id) {
  FERRY_RETURN_IF_ERROR(CheckKey(key));
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  if (it != shard.objects.end()) {
    auto& l = it->second.leases;
    auto pos = std::find_if(l.begin(), l.end(), [&](const auto& x) { return x.first == lease_id; });
    if (pos != l.end()) {
      l.erase(pos);
      return Status::Ok();
    }
  }
  return Status::NotFound("no such lease (ended, or the key is gone)");
}

Clock::time_point Master::Object::LeaseEnd(Clock::time_point now) {
  Clock::time_point end{};
  std::erase_if(leases, [&](const auto& x) { return x.second <= now; });
  for (const auto& x : leases) end = std::max(end, x.second);
  return end;
}

Status Master::Exists(const std::string& key) {
  FERRY_RETURN_IF_ERROR(CheckKey(key));
  FERRY_COUNT(exists, 1);
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  if (it == shard.objects.end() || !it->second.complete) {
    FERRY_RETURN_IF_ERROR(MissIsSure());
    return Status::NotFound("no such key");
  }
  return Status::Ok();
}

Status Master::Remove(const std::string& key, bool force) {
  return Remove(std::vector<std::string>{key}, force)[0];
}

std::vector<Status> Master::Remove(const std::vector<std::string>& keys, bool force) {
  std::vector<Queued> queued;
  std::vector<Status> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(RemoveOne(k, force, &queued));
  AwaitCatalog(queued);
  return out;
}

Status Master::RemoveOne(const std::string& key, bool force, std::vector<Queued>* queued) {
  FERRY_RETURN_IF_ERROR(CheckKey(key));
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  if (it == shard.objects.end()) {
    FERRY_RETURN_IF_ERROR(MissIsSure());
    return Status::NotFound("no such key");
  }
  return RemoveLocked(shard, it, force, Clock::now(), queued);
}

Status Master::RemoveLocked(Shard& shard, std::unordered_map<std::string, Object>::iterator it,
                            bool force, Clock::time_point now, std::vector<Queued>* queued) {
  Object& o = it->second;
  if (!force && !o.complete) return Status::Busy("the key is being written");
  const auto lease_end = o.LeaseEnd(now);
  if (!force && lease_end > now) return Status::Busy("the key is leased");
  auto until = o.complete ? lease_end : now + options_.write_grace;
  FreeLater(it->first, o, until, queued);
  shard.objects.erase(it);
  --objects_;
  FERRY_COUNT(removes, 1);
  return Status::Ok();
}

uint64_t Master::RemoveAll(bool force) {
  uint64_t removed = 0;
  const auto now = Clock::now();
  std::vector<Queued> queued;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mu);
    for (auto it = shard->objects.begin(); it != shard->objects.end();) {
      auto next = std::next(it);
      // Without force, objects being written or leased stay, as with Remove.
      if (RemoveLocked(*shard, it, force, now, &queued).ok()) ++removed;
      it = next;
    }
  }
  AwaitCatalog(queued);
  return removed;
}

Status Master::SetPin(const std::string& key, StorePin pin, Millis ttl) {
  FERRY_RETURN_IF_ERROR(CheckKey(key));
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  if (it == shard.objects.end() || !it->second.complete) {
    FERRY_RETURN_IF_ERROR(MissIsSure());
    return Status::NotFound("no such key");
  }
  it->second.pin = pin;
  it->second.pin_until = Clock::now() + ttl;
  Tell(key, it->second, /*forget=*/false);
  return Status::Ok();
}

uint64_t Master::Evict(uint64_t bytes, bool soft) {
  struct Candidate {
    bool soft_pinned;
    Clock::time_point last_access;
    std::string key;
  };
  const auto now = Clock::now();
  auto evictable = [&](Object& o, bool* soft_pinned) {
    *soft_pinned = o.pin == StorePin::kSoft && o.pin_until > now;
    return o.complete && o.pin != StorePin::kHard && (soft || !*soft_pinned) &&
           o.LeaseEnd(now) <= now;
  };
  std::vector<Candidate> cands;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mu);
    for (auto& [key, o] : shard->objects) {
      bool sp = false;
      if (evictable(o, &sp)) cands.push_back({sp, o.last_access, key});
    }
  }
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.soft_pinned != b.soft_pinned) return !a.soft_pinned;
    return a.last_access < b.last_access;
  });
  uint64_t freed = 0, count = 0;
  for (const auto& c : cands) {
    if (freed >= bytes) break;
    Shard& shard = ShardOf(c.key);
    std::lock_guard lock(shard.mu);
    auto it = shard.objects.find(c.key);
    bool sp = false;
    if (it == shard.objects.end() || !evictable(it->second, &sp)) continue;  // changed since
    freed += Bytes(it->second.replicas);
    FreeLater(it->first, it->second, now);
    shard.objects.erase(it);
    --objects_;
    ++count;
  }
  {
    std::lock_guard l(stats_mu_);
    counters_.evicted_objects += count;
    counters_.evicted_bytes += freed;
  }
  return freed;
}

void Master::Tick() {
  const auto now = Clock::now();
  // Space whose lease or write grace has ended.
  {
    std::vector<Allocation> due;
    {
      std::lock_guard lock(deferred_mu_);
      std::erase_if(deferred_, [&](Deferred& d) {
        if (d.until > now) return false;
        deferred_bytes_ -= Bytes(d.allocation);
        due.push_back(std::move(d.allocation));
        return true;
      });
    }
    for (const auto& a : due) space_.Free(a);
  }
  // Abandoned puts.
  uint64_t reclaimed = 0;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mu);
    for (auto it = shard->objects.begin(); it != shard->objects.end();) {
      if (!it->second.complete && it->second.put_deadline <= now) {
        FreeLater(std::move(it->second.replicas), now + options_.write_grace);
        it = shard->objects.erase(it);
        --objects_;
        ++reclaimed;
      } else {
        ++it;
      }
    }
  }
  {
    std::lock_guard lock(reserved_mu_);
    for (auto it = reserved_.begin(); it != reserved_.end();) {
      if (it->second.put_deadline > now) {
        ++it;
        continue;
      }
      FreeLater(std::move(it->second.replicas), now + options_.write_grace);
      it = reserved_.erase(it);
      ++reclaimed;
    }
  }
  FERRY_COUNT(puts_reclaimed, reclaimed);
  ExpireSilentNodes(now);
  // Background eviction between the watermarks.
  SpaceUsage u = space_.Usage();
  const double cap = static_cast<double>(u.capacity);
  if (u.capacity > 0 && static_cast<double>(u.used) > options_.high_watermark * cap) {
    const auto target = static_cast<uint64_t>(options_.low_watermark * cap);
    uint64_t excess = u.used - std::min(u.used, target);
    // Reservations hold space for puts that have not come: they go before
    // any object does.
    excess -= std::min(excess, DropReservations());
    if (excess > 0) Evict(excess, /*soft=*/false);
  }
}

MasterStats Master::Stats() const {
  MasterStats s;
  {
    std::lock_guard l(stats_mu_);
    s = counters_;
  }
  s.space = space_.Usage();
  s.objects = objects_.load();
  s.term = term();
  s.recovered = recovered_last_.load();
  s.catalog_pending = log_.Pending();
  std::lock_guard l(deferred_mu_);
  s.deferred_bytes = deferred_bytes_;
  return s;
}

}  // namespace ferry::store
