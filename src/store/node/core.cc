#include "store/node/core.h"

#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "gpu/gpu.h"
#include "gpu/interprocess.h"
#include "store/node/node.h"
#include "store/rpc/limits.h"

namespace ferry::store {
namespace {

// The keys that pass CheckKey, to send to the master: ask[j] is
// keys[index[j]].
struct ValidKeys {
  std::vector<std::string> ask;
  std::vector<size_t> index;
};

// Checks every key, each one's status into (*st)[i] (resized to the keys).
ValidKeys CheckKeys(std::span<const std::string> keys, std::vector<Status>* st) {
  ValidKeys v;
  st->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    (*st)[i] = CheckKey(keys[i]);
    if ((*st)[i].ok()) {
      v.ask.push_back(keys[i]);
      v.index.push_back(i);
    }
  }
  return v;
}

// Validates the keys here, sends the valid ones in one master call, and maps
// the answers back: one status per key, in order.
template <typename F>
std::vector<Status> KeyCall(std::span<const std::string> keys, F&& call) {
  std::vector<Status> out;
  const auto [ask, index] = CheckKeys(keys, &out);
  if (ask.empty()) return out;
  Result<std::vector<Status>> r = call(ask);
  for (size_t j = 0; j < ask.size(); ++j) out[index[j]] = r.ok() ? r.value()[j] : r.status();
  return out;
}

// Calls f(part bytes, extent, offset in the extent, length) for each piece
// where the replica's extents and the parts, both in value order, overlap.
template <typename F>
void Pieces(const StoreReplica& rep, std::span<const Part> parts, F&& f) {
  size_t pi = 0;
  uint64_t po = 0;
  for (const StoreExtent& e : rep.extents) {
    uint64_t eo = 0;
    while (eo < e.length && pi < parts.size()) {
      const uint64_t n = std::min<uint64_t>(e.length - eo, parts[pi].size - po);
      if (n > 0) f(parts[pi].data + po, e, eo, n);
      eo += n;
      po += n;
      if (po == parts[pi].size) {
        ++pi;
        po = 0;
      }
    }
  }
}

// One engine batch over `reqs`; per-request outcome into `out` (OK or the
// error). Requests not done by `deadline` fail with Timeout. `stream` orders
// the GPU memory among them (R1, R2).
void RunBatch(Engine& engine, const std::vector<Request>& reqs, Deadline deadline, void* stream,
              std::vector<Status>* out) {
  out->assign(reqs.size(), Status::Ok());
  if (reqs.empty()) return;
  auto left = std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline.Remaining()));
  SubmitOptions so;
  so.timeout = left;
  so.stream = stream;
  auto batch = engine.Submit(reqs, so);
  if (!batch.ok()) {
    out->assign(reqs.size(), batch.status());
    return;
  }
  (void)batch.value()->Wait(left + Millis(100));
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestResult r = batch.value()->Result(i);
    if (!r.done) {
      (*out)[i] = Status::Timeout("transfer not done before the deadline");
    } else if (!r.status.ok()) {
      (*out)[i] = r.status;
    }
  }
  // Freeing the batch cancels what is left and waits until no buffer is touched.
}

// Copies into or out of this process's node memory: small ones inline, where
// a hand-off would cost more than the copy; from this many bytes per call on,
// through the engine's own segment, whose copy threads share the work.
constexpr uint64_t kEngineCopyBytes = 4ull << 20;

}  // namespace

size_t TotalSize(std::span<const Part> parts) {
  size_t n = 0;
  for (const Part& p : parts) n += p.size;
  return n;
}

struct LocalCopy {
  uint8_t* dst;
  const uint8_t* src;
  uint64_t length;
  size_t owner;  // the item it belongs to
};

StoreCore::StoreCore(Engine& engine, MasterClient& client, StoreNode* node, CoreOptions options)
    : engine_(engine), client_(client), node_(node), options_(options) {
  if (options_.reserve_bytes > 0) {
    const bool prefer_local = options_.prefer_local && node_ != nullptr;
    pool_ = std::make_unique<ReservePool>(client_, prefer_local ? engine_.name() : "", prefer_local,
                                          options_.reserve_bytes);
  }
  rel_thread_ = std::thread([this] {
    NameThisThread("ferry-release");
    ReleaseLoop();
  });
}

StoreCore::~StoreCore() {
  {
    std::lock_guard lock(rel_mu_);
    rel_stop_ = true;
  }
  rel_cv_.notify_all();
  rel_thread_.join();
}

void StoreCore::QueueReleases(std::vector<std::pair<std::string, uint64_t>> leases) {
  {
    std::lock_guard lock(rel_mu_);
    for (auto& l : leases) rel_queue_.push_back(std::move(l));
  }
  rel_cv_.notify_one();
}

// Sends every queued release; best effort, since leases end anyway.
void StoreCore::FlushReleases() {
  std::lock_guard send(rel_send_mu_);
  std::vector<std::pair<std::string, uint64_t>> batch;
  {
    std::lock_guard lock(rel_mu_);
    batch.swap(rel_queue_);
  }
  if (batch.empty()) return;
  auto r = client_.ReleaseLeases(batch);
  if (!r.ok()) FERRY_LOG_WARN("store: ending {} leases: {}", batch.size(), r.status().ToString());
}

void StoreCore::ReleaseLoop() {
  std::unique_lock lock(rel_mu_);
  while (!rel_stop_ || !rel_queue_.empty()) {
    rel_cv_.wait_for(lock, Millis(1000), [this] { return rel_stop_ || !rel_queue_.empty(); });
    lock.unlock();
    FlushReleases();
    lock.lock();
  }
}

Result<SegmentId> StoreCore::Segment(const std::string& name) {
  {
    std::lock_guard lock(seg_mu_);
    auto it = segments_.find(name);
    if (it != segments_.end()) return it->second;
  }
  FERRY_ASSIGN_OR_RETURN(SegmentId id, engine_.OpenSegment(name));
  std::lock_guard lock(seg_mu_);
  auto [it, added] = segments_.emplace(name, id);
  if (!added) (void)engine_.CloseSegment(id);  // another thread opened it meanwhile
  return it->second;
}

bool StoreCore::AnyGpu(std::span<const LocalCopy> copies, Op op) {
  for (const LocalCopy& c : copies) {
    if (IsGpu(op == Op::kWrite ? c.src : c.dst, c.length)) return true;
  }
  return false;
}

Status StoreCore::CopyLocal(std::span<const LocalCopy> copies, Op op, void* own,
                            std::vector<Request>* reqs, std::vector<size_t>* owner) {
  if (own != nullptr && AnyGpu(copies, op)) {
    // The stream already waits for the client's work on the GPU, and is
    // nobody else's: one DMA per piece, one wait for all, no thread hop.
    Status st;
    for (const LocalCopy& c : copies) {
      if (!IsGpu(op == Op::kWrite ? c.src : c.dst, c.length)) {
        std::memcpy(c.dst, c.src, c.length);
      } else if (st.ok()) {
        st = gpu::CopyOnStream(c.dst, c.src, c.length, own);
      }
    }
    Status waited = gpu::WaitStream(own);  // even after a failure: nothing may still touch them
    return st.ok() ? waited : st;
  }
  uint64_t bytes = 0;
  for (const LocalCopy& c : copies) bytes += c.length;
  // GPU memory is the engine's to copy (R1-R3), whatever the size.
  Result<SegmentId> self = Status::NotFound("inline");
  if (bytes >= kEngineCopyBytes || AnyGpu(copies, op)) self = Segment(engine_.name());
  for (const LocalCopy& c : copies) {
    if (!self.ok()) {
      std::memcpy(c.dst, c.src, c.length);
      continue;
    }
    // The node's side is the engine's "remote" address in its own segment.
    uint8_t* mine = op == Op::kWrite ? const_cast<uint8_t*>(c.src) : c.dst;
    const uint8_t* node = op == Op::kWrite ? c.dst : c.src;
    reqs->push_back(
        {op, mine, self.value(), reinterpret_cast<uint64_t>(node), c.length, engine_.epoch()});
    owner->push_back(c.owner);
  }
  return Status::Ok();
}

bool StoreCore::Local(const StoreReplica& rep, const StoreExtent& e) const {
  // Of this process's own epoch only: a location of this node's previous
  // incarnation goes to the engine, which refuses it (PeerRestarted).
  return node_ != nullptr && rep.epoch == engine_.epoch() && e.segment == engine_.name() &&
         node_->Owns(e.addr, e.length);
}

std::vector<Status> StoreCore::Put(std::span<const std::string> keys,
                                   std::span<const Source> values, const PutOptions& po,
                                   std::vector<Status> pre, bool own_stream) {
  std::vector<size_t> retry;
  std::vector<Status> out = PutPass(keys, values, po, std::move(pre), own_stream, true, &retry);
  if (retry.empty()) return out;
  // What voided these (a node or master lost) likely voided the rest.
  pool_->Drop();
  std::vector<Status> again(keys.size(), Status::Cancelled("not retried"));
  for (size_t i : retry) again[i] = Status::Ok();
  again = PutPass(keys, values, po, std::move(again), own_stream, false, nullptr);
  for (size_t i : retry) out[i] = std::move(again[i]);
  return out;
}

std::vector<Status> StoreCore::PutPass(std::span<const std::string> keys,
                                       std::span<const Source> values, const PutOptions& po,
                                       std::vector<Status> out, bool own_stream, bool reserve,
                                       std::vector<size_t>* retry) {
  out.resize(keys.size());
  if (values.size() != keys.size()) {
    out.assign(keys.size(), Status::InvalidArgument("keys and values differ in count"));
    return out;
  }
  std::vector<PutSpec> items;
  std::vector<size_t> index;  // items[j] is keys[index[j]]
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i].ok()) continue;
    out[i] = CheckKey(keys[i]);
    const size_t size = TotalSize(values[i].parts);
    if (out[i].ok() && size == 0) out[i] = Status::InvalidArgument("empty value");
    if (!out[i].ok()) continue;
    PutSpec it;
    it.key = keys[i];
    it.size = size;
    it.replicas = po.replicas == 0 ? options_.replicas : po.replicas;
    it.preferred = po.preferred_segment;
    it.pin = po.pin;
    it.pin_ttl = po.pin_ttl;
    items.push_back(std::move(it));
    index.push_back(i);
  }
  if (items.empty()) return out;
  const auto t0 = Clock::now();
  // Reserved space for the items with no placement or pin asked for; the
  // others, and the misses, begin at the master.
  std::vector<Result<PutGrant>> g(items.size(), Status::Internal("no grant"));
  std::vector<Clock::time_point> deadline(items.size(), Clock::time_point::max());
  std::vector<bool> reserved(items.size(), false);
  std::vector<PutSpec> ask;
  std::vector<size_t> asked;  // ask[k] is items[asked[k]]
  std::map<std::pair<uint64_t, uint32_t>, size_t> shapes;
  for (size_t j = 0; j < items.size(); ++j) {
    const PutSpec& it = items[j];
    if (reserve && pool_ && it.preferred.empty() && it.pin == StorePin::kNone) {
      ++shapes[{it.size, it.replicas}];
      if (auto r = pool_->Take(it.size, it.replicas)) {
        g[j] = PutGrant{r->put_id, std::move(r->replicas), r->timeout};
        deadline[j] = r->deadline;
        reserved[j] = true;
        continue;
      }
    }
    ask.push_back(it);
    asked.push_back(j);
  }
  if (!ask.empty()) {
    const bool prefer_local = options_.prefer_local && node_ != nullptr;
    auto grants = client_.PutBegin(ask, prefer_local ? engine_.name() : "", prefer_local);
    for (size_t k = 0; k < ask.size(); ++k) {
      const size_t j = asked[k];
      g[j] = grants.ok() ? std::move(grants.value()[k]) : Result<PutGrant>(grants.status());
      if (g[j].ok()) deadline[j] = t0 + g[j].value().timeout;
    }
  }
  // After this put's own space is granted, so the next ones' reservations
  // never take it first.
  for (const auto& [shape, n] : shapes) pool_->Want(shape.first, shape.second, n);
  // Every replica's bytes: copied here for this process's memory, else one
  // engine batch for all.
  std::vector<Request> reqs;
  std::vector<size_t> owner;
  std::vector<LocalCopy> local;
  Clock::time_point end = Clock::time_point::max();  // the first put timeout
  for (size_t j = 0; j < items.size(); ++j) {
    Status& st = out[index[j]];
    st = g[j].status();
    if (!st.ok()) continue;
    end = std::min(end, deadline[j]);
    const Source& src = values[index[j]];
    for (const auto& rep : g[j].value().replicas) {
      Pieces(rep, src.parts, [&](uint8_t* p, const StoreExtent& e, uint64_t eo, uint64_t n) {
        if (Local(rep, e)) {
          local.push_back({reinterpret_cast<uint8_t*>(e.addr + eo), p, n, j});
        } else if (auto seg = Segment(e.segment); !seg.ok()) {
          st = seg.status();
        } else {
          reqs.push_back({Op::kWrite, p, seg.value(), e.addr + eo, n, rep.epoch});
          owner.push_back(j);
        }
      });
    }
  }
  if (Status direct = CopyLocal(local, Op::kWrite, own_stream ? po.stream : nullptr, &reqs, &owner);
      !direct.ok()) {
    for (const LocalCopy& c : local) {
      if (out[index[c.owner]].ok()) out[index[c.owner]] = direct;
    }
  }
  std::vector<Status> moved;
  RunBatch(engine_, reqs, Deadline(end), po.stream, &moved);
  for (size_t r = 0; r < reqs.size(); ++r) {
    Status& st = out[index[owner[r]]];
    if (st.ok() && !moved[r].ok()) st = moved[r];
  }
  // Commit what arrived everywhere, abort the rest: all or nothing per value.
  std::vector<PutEnd> ends;
  std::vector<size_t> end_index;
  for (size_t j = 0; j < items.size(); ++j) {
    if (!g[j].ok()) continue;
    ends.push_back({items[j].key, g[j].value().put_id, out[index[j]].ok(), reserved[j]});
    end_index.push_back(index[j]);
  }
  if (ends.empty()) return out;
  auto ended = client_.PutEnd(ends);
  for (size_t k = 0; k < ends.size(); ++k) {
    Status& st = out[end_index[k]];
    if (!ends[k].commit) continue;
    st = ended.ok() ? ended.value()[k] : ended.status();
  }
  // A reservation may be void: its node gone, or its master. The item goes
  // again through PutBegin, so that a put fails only as it would have
  // without one; a taken key fails either way.
  for (size_t j = 0; retry != nullptr && j < items.size(); ++j) {
    const StatusCode code = out[index[j]].code();
    if (reserved[j] && code != StatusCode::kOk && code != StatusCode::kAlreadyExists &&
        code != StatusCode::kBusy) {
      retry->push_back(index[j]);
    }
  }
  return out;
}

Status StoreCore::ReadPrefix(const StoreReplica& rep, size_t n, Deadline deadline,
                             std::string* out) {
  out->assign(n, '\0');
  std::vector<Part> into = {Part{reinterpret_cast<uint8_t*>(out->data()), n}};
  std::vector<Request> reqs;
  Status st;
  Pieces(rep, into, [&](uint8_t* p, const StoreExtent& e, uint64_t eo, uint64_t len) {
    if (Local(rep, e)) {
      std::memcpy(p, reinterpret_cast<const void*>(e.addr + eo), len);
    } else if (auto seg = Segment(e.segment); !seg.ok()) {
      st = seg.status();
    } else {
      reqs.push_back({Op::kRead, p, seg.value(), e.addr + eo, len, rep.epoch});
    }
  });
  std::vector<Status> moved;
  RunBatch(engine_, reqs, deadline, nullptr, &moved);
  for (const Status& m : moved) st = st.ok() ? m : st;
  return st;
}

std::vector<Result<size_t>> StoreCore::Get(std::span<const std::string> keys, std::span<Sink> sinks,
                                           void* stream, std::string_view expect, bool own_stream) {
  std::vector<Status> st;
  const auto [ask, index] = CheckKeys(keys, &st);
  std::vector<uint64_t> sizes(keys.size(), 0);
  const auto t0 = Clock::now();
  std::vector<Result<GetGrant>> found;
  if (!ask.empty()) {
    auto r = client_.Get(ask);
    if (!r.ok()) {
      for (size_t i : index) st[i] = r.status();
    } else {
      found = std::move(r).value();
    }
  }
  // Replica order per item: one in this process first.
  std::vector<std::vector<size_t>> order(found.size());
  std::vector<std::vector<Part>> dst(found.size());
  Clock::time_point lease_end = Clock::time_point::max();  // the first lease to end
  for (size_t j = 0; j < found.size(); ++j) {
    const size_t i = index[j];
    st[i] = found[j].status();
    if (!st[i].ok()) continue;
    const ObjectLocation& loc = found[j].value().location;
    sizes[i] = loc.size;
    Sink& s = sinks[i];
    s.size = loc.size;
    if (s.vec != nullptr) {
      try {
        s.vec->resize(loc.size);
      } catch (const std::bad_alloc&) {
        st[i] = Status::ResourceExhausted("cannot allocate " + std::to_string(loc.size) +
                                          " bytes for the value");
        continue;
      }
      dst[j] = {Part{s.vec->data(), loc.size}};
    } else if (s.pack != nullptr) {
      if (s.pack->cap - s.pack->used < loc.size) {
        st[i] = Status::OutOfRange("no room left for the value's " + std::to_string(loc.size) +
                                   " bytes");
        continue;
      }
      s.parts = dst[j] = {Part{s.pack->base + s.pack->used, loc.size}};
      s.pack->used += loc.size;
    } else if (const size_t cap = TotalSize(s.parts); cap < loc.size) {
      st[i] = Status::OutOfRange("buffer of " + std::to_string(cap) + " bytes; the value has " +
                                 std::to_string(loc.size));
      continue;
    } else {
      dst[j] = s.parts;
    }
    lease_end = std::min(lease_end, t0 + loc.lease);
    for (size_t r = 0; r < loc.replicas.size(); ++r) {
      const bool local = Local(loc.replicas[r], loc.replicas[r].extents.front());
      if (local) {
        order[j].insert(order[j].begin(), r);
      } else {
        order[j].push_back(r);
      }
    }
  }
  const Deadline deadline(lease_end);
  if (options_.read_delay.count() > 0) std::this_thread::sleep_for(options_.read_delay);
  // Rounds: each item reads its next replica until one succeeds.
  std::vector<size_t> pending;
  for (size_t j = 0; j < found.size(); ++j) {
    if (!st[index[j]].ok()) continue;
    if (deadline.Expired()) {
      st[index[j]] = Status::Timeout("the lease ended before the read began");
      continue;
    }
    if (!expect.empty()) {
      // Checked on the replica read first, before a byte reaches the sink.
      std::string prefix;
      Status& s = st[index[j]];
      const ObjectLocation& loc = found[j].value().location;
      if (loc.size < expect.size()) {
        s = Status::InvalidArgument("the value is shorter than the expected bytes");
      } else if (s = ReadPrefix(loc.replicas[order[j][0]], expect.size(), deadline, &prefix);
                 s.ok() && prefix != expect) {
        s = Status::InvalidArgument("the value does not begin with the expected bytes");
      }
      if (!s.ok()) continue;
    }
    pending.push_back(j);
  }
  for (size_t round = 0; !pending.empty(); ++round) {
    std::vector<Request> reqs;
    std::vector<size_t> owner;
    std::vector<LocalCopy> local;
    std::vector<Status> item(found.size());
    for (size_t j : pending) {
      const StoreReplica& rep = found[j].value().location.replicas[order[j][round]];
      Pieces(rep, dst[j], [&](uint8_t* p, const StoreExtent& e, uint64_t eo, uint64_t n) {
        if (Local(rep, e)) {
          local.push_back({p, reinterpret_cast<const uint8_t*>(e.addr + eo), n, j});
        } else if (auto seg = Segment(e.segment); !seg.ok()) {
          item[j] = seg.status();
        } else {
          reqs.push_back({Op::kRead, p, seg.value(), e.addr + eo, n, rep.epoch});
          owner.push_back(j);
        }
      });
    }
    if (Status direct = CopyLocal(local, Op::kRead, own_stream ? stream : nullptr, &reqs, &owner);
        !direct.ok()) {
      for (const LocalCopy& c : local) {
        if (item[c.owner].ok()) item[c.owner] = direct;
      }
    }
    std::vector<Status> moved;
    RunBatch(engine_, reqs, deadline, stream, &moved);
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (item[owner[r]].ok() && !moved[r].ok()) item[owner[r]] = moved[r];
    }
    std::vector<size_t> next;
    for (size_t j : pending) {
      if (item[j].ok()) continue;
      if (round + 1 < order[j].size() && !deadline.Expired()) {
        next.push_back(j);
      } else {
        st[index[j]] = item[j];
      }
    }
    pending = std::move(next);
  }
  // The lease is what kept the bytes from being reused while we read them.
  const bool late = deadline.Expired();
  // Done reading: end the leases soon rather than at their term, so that the
  // space can be evicted or the key removed.
  std::vector<std::pair<std::string, uint64_t>> leases;
  for (size_t j = 0; j < found.size(); ++j) {
    if (found[j].ok()) leases.emplace_back(keys[index[j]], found[j].value().lease_id);
  }
  if (!leases.empty()) QueueReleases(std::move(leases));
  std::vector<Result<size_t>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i].ok() && late) {
      st[i] = Status::Timeout("the read outlived its lease; the bytes may have been reused");
    }
    out.push_back(st[i].ok() ? Result<size_t>(sizes[i]) : Result<size_t>(st[i]));
  }
  return out;
}

std::vector<Status> StoreCore::Exists(std::span<const std::string> keys) {
  return KeyCall(keys, [&](const std::vector<std::string>& k) { return client_.Exists(k); });
}

std::vector<Status> StoreCore::Remove(std::span<const std::string> keys, bool force) {
  FlushReleases();  // this core's finished reads no longer hold the keys
  return KeyCall(keys, [&](const std::vector<std::string>& k) { return client_.Remove(k, force); });
}

std::vector<Status> StoreCore::Pin(std::span<const std::string> keys, StorePin pin,
                                   std::chrono::milliseconds ttl) {
  return KeyCall(keys, [&](const std::vector<std::string>& k) { return client_.Pin(k, pin, ttl); });
}

std::vector<Result<ObjectLocation>> StoreCore::Locate(std::span<const std::string> keys) {
  std::vector<Status> st;
  const auto [ask, index] = CheckKeys(keys, &st);
  // The valid keys' results are all set from the master's answer below.
  std::vector<Result<ObjectLocation>> out(st.begin(), st.end());
  if (ask.empty()) return out;
  auto r = client_.Get(ask);
  for (size_t j = 0; j < ask.size(); ++j) {
    if (!r.ok()) {
      out[index[j]] = r.status();
    } else if (!r.value()[j].ok()) {
      out[index[j]] = r.value()[j].status();
    } else {
      out[index[j]] = std::move(r.value()[j].value().location);
    }
  }
  return out;
}

}  // namespace ferry::store
