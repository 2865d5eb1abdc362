// A peer's segment as seen by this engine: its name, cached descriptor and
// the transports' endpoints to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/types.h"
#include "transfer/descriptor.h"

namespace ferry {

class Endpoint;
class Transport;

class Segment {
 public:
  Segment(SegmentId id, std::string name, std::string host, uint16_t port, bool is_self)
      : id_(id), name_(std::move(name)), host_(std::move(host)), port_(port), is_self_(is_self) {}
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegmentId id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  bool is_self() const { return is_self_; }

  std::shared_ptr<const SegmentDescriptor> descriptor() const {
    std::lock_guard lk(mu_);
    return desc_;
  }
  void set_descriptor(std::shared_ptr<const SegmentDescriptor> d) {
    std::lock_guard lk(mu_);
    desc_ = std::move(d);
  }

  // Set by a transport that saw the peer restart or die; the engine refetches
  // the descriptor before the next submit to this segment.
  void MarkStale() { stale_.store(true, std::memory_order_release); }
  bool TakeStale() { return stale_.exchange(false, std::memory_order_acq_rel); }

  // Same-host peers: maps the owner's generation page named by `d` (once per
  // owner process), so Outdated() can tell, with one load, that the owner
  // has unregistered memory since `d` was made. Best effort: without the
  // page, a stale range is still refused by the owner (tcp) or found
  // missing at the next refresh.
  void WatchGeneration(const SegmentDescriptor& d, const std::string& local_host_id);
  bool Outdated() const;
  // Whether the owner's generation page is mapped, so Outdated() can tell.
  bool Watched() const {
    std::lock_guard lk(mu_);
    return generation_ != nullptr;
  }

  // Held while the descriptor is refetched: one refresh at a time.
  std::unique_lock<std::mutex> LockRefresh() { return std::unique_lock(refresh_mu_); }

  // The endpoint cache, one per transport.
  using Connector = std::function<Result<std::shared_ptr<Endpoint>>()>;
  // `transport`'s endpoint to this segment, made by `connect` when there is
  // none yet (its error is returned, and nothing cached). `connect` runs
  // under the cache's lock, so it must not block.
  Result<std::shared_ptr<Endpoint>> EndpointFor(const Transport* transport,
                                                const Connector& connect);
  // The cached endpoints, as they are now.
  std::vector<std::pair<const Transport*, std::shared_ptr<Endpoint>>> Endpoints() const;
  // Forgets `transport`'s endpoint if it is still `endpoint`.
  void DropEndpoint(const Transport* transport, const std::shared_ptr<Endpoint>& endpoint);
  // Takes every endpoint out of the cache, then closes each: their held
  // tasks fail promptly; work in flight keeps them until done.
  void CloseEndpoints();

 private:
  const SegmentId id_;
  const std::string name_;
  const std::string host_;
  const uint16_t port_;
  const bool is_self_;
  mutable std::mutex mu_;
  std::shared_ptr<const SegmentDescriptor> desc_;  // guarded by mu_
  std::atomic<bool> stale_{false};
  // The owner's generation counter, mapped; its epoch. Guarded by mu_.
  const uint64_t* generation_ = nullptr;
  uint64_t generation_epoch_ = 0;
  std::mutex refresh_mu_;
  mutable std::mutex endpoints_mu_;
  std::map<const Transport*, std::shared_ptr<Endpoint>> endpoints_;  // guarded by endpoints_mu_
};

}  // namespace ferry
