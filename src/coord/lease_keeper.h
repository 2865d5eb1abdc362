// Keeps an etcd lease alive from a thread of its own, and says when it is lost.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "common/clock.h"
#include "coord/etcd_client.h"
#include "ferry/status.h"

namespace ferry {
class Ticker;
}

namespace ferry::coord {

class LeaseKeeper {
 public:
  // Called once, on the keeper's thread, when the lease is lost: NotFound
  // when etcd says it expired or was revoked, Unavailable (or Timeout) when
  // no renewal got through for a whole TTL, after which etcd has dropped it.
  // The keeper renews it no more. It must not destroy the keeper.
  using LostFn = std::function<void(const Status&)>;

  // Renews `lease` every third of its TTL, and every 100 ms after a renewal
  // that failed but may still be in time. The first renewal is a third of
  // the TTL from now, so the lease must be fresh.
  LeaseKeeper(std::shared_ptr<EtcdClient> client, Lease lease, LostFn on_lost);
  // Stops renewing (without revoking: the caller decides) and waits for a
  // renewal under way, at most the client's call timeout per endpoint.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  LeaseId id() const { return lease_.id; }
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  // The lease lives at least until then: its last renewal's request (or
  // the keeper's start) plus the TTL, by this process's clock. Never blocks.
  Clock::time_point alive_until() const {
    return Clock::time_point(Clock::duration(alive_until_.load(std::memory_order_acquire)));
  }

 private:
  void Renew();

  const std::shared_ptr<EtcdClient> client_;
  const Lease lease_;
  const LostFn on_lost_;
  Clock::time_point renewed_;  // the keeper thread's own
  std::atomic<bool> lost_{false};
  std::atomic<Clock::rep> alive_until_{0};
  std::unique_ptr<Ticker> ticker_;
};

}  // namespace ferry::coord
