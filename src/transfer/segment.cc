#include "transfer/segment.h"

#include <sys/mman.h>

#include "common/log.h"
#include "transfer/peer_memfd.h"
#include "transfer/transport.h"

namespace ferry {

Segment::~Segment() {
  if (generation_ != nullptr) munmap(const_cast<uint64_t*>(generation_), kGenerationPageBytes);
}

void Segment::WatchGeneration(const SegmentDescriptor& d, const std::string& local_host_id) {
  if (is_self_ || d.control_memfd < 0 || d.host_id != local_host_id || !MayAskForMemfds(d)) {
    return;  // a peer that shares no memfds with us is not watched
  }
  {
    std::lock_guard lk(mu_);
    if (generation_ != nullptr && generation_epoch_ == d.epoch) return;
  }
  auto page = MapPeerMemfd(d, {d.control_memfd, 0, 0, kGenerationPageBytes}, kPeerMemfdTimeout);
  if (!page.ok()) {
    FERRY_LOG_WARN("segment {}: cannot watch its registrations: {}", name_,
                   page.status().ToString());
    return;
  }
  const uint64_t* old;
  {
    std::lock_guard lk(mu_);
    old = generation_;
    generation_ = reinterpret_cast<const uint64_t*>(page.value());
    generation_epoch_ = d.epoch;
  }
  // Readers load it under mu_ only, so the old owner's page can go now.
  if (old != nullptr) munmap(const_cast<uint64_t*>(old), kGenerationPageBytes);
}

bool Segment::Outdated() const {
  std::lock_guard lk(mu_);
  if (generation_ == nullptr || desc_ == nullptr || desc_->epoch != generation_epoch_) {
    return false;
  }
  return __atomic_load_n(generation_, __ATOMIC_ACQUIRE) != desc_->generation;
}

Result<std::shared_ptr<Endpoint>> Segment::EndpointFor(const Transport* transport,
                                                       const Connector& connect) {
  std::lock_guard lk(endpoints_mu_);
  auto it = endpoints_.find(transport);
  if (it != endpoints_.end()) return it->second;
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Endpoint> ep, connect());
  endpoints_[transport] = ep;
  return ep;
}

std::vector<std::pair<const Transport*, std::shared_ptr<Endpoint>>> Segment::Endpoints() const {
  std::lock_guard lk(endpoints_mu_);
  return {endpoints_.begin(), endpoints_.end()};
}

void Segment::DropEndpoint(const Transport* transport, const std::shared_ptr<Endpoint>& endpoint) {
  std::lock_guard lk(endpoints_mu_);
  auto it = endpoints_.find(transport);
  if (it != endpoints_.end() && it->second == endpoint) endpoints_.erase(it);
}

void Segment::CloseEndpoints() {
  std::map<const Transport*, std::shared_ptr<Endpoint>> taken;
  {
    std::lock_guard lk(endpoints_mu_);
    taken.swap(endpoints_);
  }
  for (auto& [t, ep] : taken) ep->Close();
}

}  // namespace ferry
