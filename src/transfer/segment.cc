#include "transfer/segment.h"

#include <sys/mman.h>

#include "common/log.h"
#include "transfer/peer_memfd.h"

namespace ferry {

Segment::~Segment() {
  if (generation_ != nullptr) munmap(const_cast<uint64_t*>(generation_), kGenerationPageBytes);
}

void Segment::WatchGeneration(const SegmentDescriptor& d, const std::string& local_host_id) {
  if (is_self_ || d.control_memfd < 0 || d.host_id != local_host_id) return;
  {
    std::lock_guard lk(mu_);
    if (generation_ != nullptr && generation_epoch_ == d.epoch) return;
  }
  auto page = MapPeerMemfd(d.pid, d.control_memfd, kGenerationPageBytes);
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

}  // namespace ferry
