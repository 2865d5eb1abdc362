// Node membership and liveness: mounts, heartbeats, unmounts, the replicas
// a lost node takes with it, and the gate (MasterOptions::gate) that node
// expiry and the wait for awaited nodes count their TTL from.
#include <algorithm>

#include "common/log.h"
#include "store/master/master.h"
#include "store/master/master_util.h"

namespace ferry::store {

Status Master::Mount(const std::string& node, uint64_t epoch, const std::vector<Region>& regions) {
  NodeMount m{node, epoch, {}, {}, false};
  for (const Region& r : regions) m.regions.emplace_back(r.base, r.size);
  return Mount(m).status();
}

Result<MountReply> Master::Mount(const NodeMount& m) {
  if (m.node.empty() || m.node.size() > 256) {
    return Status::InvalidArgument("node name must be 1 to 256 bytes");
  }
  std::vector<Region> regions;
  for (auto [base, size] : m.regions) regions.push_back({base, size});
  uint64_t replaced = 0;
  auto gen = space_.Mount(m.node, m.epoch, regions, &replaced);
  if (!gen.ok()) return gen.status();
  log_.Reset(m.node, gen.value());
  // Puts granted before (by this master or another) may still write the
  // free space; a read lease may still read it.
  if (m.resumed) {
    space_.Fence(
        m.node, gen.value(),
        Clock::now() + std::max(options_.put_timeout, options_.lease) + options_.write_grace);
  }
  // Before the old mount's replicas go: one the catalog confirms moves to
  // the new mount instead.
  const uint64_t recovered = Recover(m.node, gen.value(), m.catalog);
  if (replaced != 0) {
    DropNode(m.node, replaced);
    log_.Drop(m.node, replaced);
  }
  recovered_last_ = recovered;
  FERRY_COUNT(recovered_total, recovered);
  if (rebuilding_.load(std::memory_order_acquire)) {
    std::lock_guard lk(awaited_mu_);  // after Recover: its objects are known now
    awaited_.erase(m.node);
  }
  FERRY_LOG_INFO(
      "master: node {} (epoch {:x}) mounted {} regions (generation {}); {} of {} catalog "
      "entries recovered",
      m.node, m.epoch, regions.size(), gen.value(), recovered, m.catalog.size());
  return MountReply{options_.node_ttl, term(), recovered, options_.catalog_sync.count() > 0};
}

Result<std::vector<CatalogChange>> Master::Heartbeat(const std::string& node, uint64_t acked,
                                                     bool fetch, Millis hold) {
  if (!space_.Touch(node)) {
    return Status::NotFound("node " + node + " is not mounted");
  }
  // Held well within the node's TTL, which this call has just renewed.
  hold = options_.catalog_sync.count() > 0 ? std::clamp(hold, Millis(0), options_.node_ttl / 3)
                                           : Millis(0);
  return log_.Since(node, acked, fetch, hold);
}

Status Master::Unmount(const std::string& node) {
  const uint64_t gen = space_.Unmount(node);
  if (gen == 0) return Status::NotFound("node " + node + " is not mounted");
  DropNode(node, gen);
  log_.Drop(node, gen);
  return Status::Ok();
}

void Master::DropNode(const std::string& node, uint64_t generation) {
  uint64_t dropped = 0;
  {
    // A reservation, like an open put, is whole or nothing.
    std::lock_guard lock(reserved_mu_);
    for (auto it = reserved_.begin(); it != reserved_.end();) {
      auto& reps = it->second.replicas;
      const size_t before = reps.size();
      std::erase_if(
          reps, [&](const Allocation& a) { return a.node == node && a.generation == generation; });
      if (reps.size() == before) {
        ++it;
        continue;
      }
      FreeLater(std::move(reps), Clock::now() + options_.write_grace);
      it = reserved_.erase(it);
    }
  }
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mu);
    for (auto it = shard->objects.begin(); it != shard->objects.end();) {
      auto& reps = it->second.replicas;
      const size_t before = reps.size();
      std::erase_if(
          reps, [&](const Allocation& a) { return a.node == node && a.generation == generation; });
      dropped += before - reps.size();
      // An object being written loses its all-or-nothing promise with a replica.
      if (reps.empty() || (!it->second.complete && reps.size() != before)) {
        FreeLater(std::move(reps), Clock::now() + options_.write_grace);
        it = shard->objects.erase(it);
        --objects_;
      } else {
        ++it;
      }
    }
  }
  FERRY_COUNT(replicas_dropped, dropped);
  FERRY_LOG_INFO("master: node {} unmounted; {} replicas dropped", node, dropped);
}

Status Master::MissIsSure() {
  if (!rebuilding_.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard lk(awaited_mu_);
  const Clock::time_point by = AfterServedTtl(rebuilt_by_);
  if (awaited_.empty() || Clock::now() >= by) {
    rebuilding_ = false;
    return Status::Ok();
  }
  return Status::Unavailable(fmt::format(
      "not sure the key is absent: this master is rebuilding its catalog, and {} node(s) "
      "such as {} have still to mount again (for {} ms more while it serves)",
      awaited_.size(), *awaited_.begin(),
      std::chrono::duration_cast<Millis>(by - Clock::now()).count()));
}

Status Master::Gate() {
  if (!options_.gate) return Status::Ok();
  Status st = options_.gate();
  if (!st.ok()) {
    // Forward only: a caller paused between its clock and its store must
    // not shorten the TTL a later refusal started.
    const Clock::rep t = Clock::now().time_since_epoch().count();
    Clock::rep prev = refused_at_.load();
    while (prev < t && !refused_at_.compare_exchange_weak(prev, t)) {
    }
  }
  return st;
}

Clock::time_point Master::AfterServedTtl(Clock::time_point t) const {
  const Clock::rep refused = refused_at_.load();
  if (refused == 0) return t;
  return std::max(t, Clock::time_point(Clock::duration(refused)) + options_.node_ttl);
}

void Master::ExpireSilentNodes(Clock::time_point now) {
  // Silent nodes: only once the master has served them a whole TTL, for
  // their heartbeats were refused while the gate was shut.
  if (Status open = Gate(); serving_.exchange(open.ok()) != open.ok()) {
    if (open.ok()) {
      FERRY_LOG_WARN("master: serving again; nodes' TTLs count from the last refusal");
    } else {
      FERRY_LOG_WARN("master: refusing calls ({}); no node is expired meanwhile", open.message());
    }
  }
  // The wait for awaited nodes ends here too, not only at the next miss,
  // so a later refusal does not open it again.
  if (rebuilding_.load(std::memory_order_acquire)) (void)MissIsSure();
  if (AfterServedTtl(now) <= now) {
    for (const auto& [node, gen] : space_.Expire(now - options_.node_ttl)) {
      FERRY_COUNT(nodes_expired, 1);
      FERRY_LOG_WARN("master: node {} missed its heartbeat TTL; unmounting it", node);
      DropNode(node, gen);
      log_.Drop(node, gen);
    }
  }
}

}  // namespace ferry::store
