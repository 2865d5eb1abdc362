// The set of this process's registered ranges. The listener checks every
// remote (address, length) against it before touching memory.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "gpu/gpu.h"

namespace ferry {

struct Region {
  uint64_t addr = 0;
  uint64_t length = 0;
  int memfd = -1;       // >= 0 when engine-allocated and shareable by mapping
  bool owned = false;   // allocated by the engine: unmapped and closed on removal
  bool pinned = false;  // page-locked by the engine for GPU copies
  gpu::MemoryKind kind = gpu::MemoryKind::kHostPageable;  // classified at registration
  int device = -1;
  uint64_t serial = 0;  // the engine's registration count when added; see RegionDesc
  // One per transport the engine offers, in its descriptor's order: what
  // each wrote for this region (Transport::DescribeMemory).
  std::vector<std::string> blobs;
};

class MemoryRegistry {
 public:
  // InvalidArgument for zero length or address overflow, AlreadyExists on overlap.
  Status Add(const Region& region);
  // NotFound unless a region starts at `addr`; InvalidArgument, leaving it in
  // place, unless it was allocated by the engine exactly when `owned` says
  // (engine memory is freed, other memory unregistered). Returns the region.
  Result<Region> Remove(uint64_t addr, bool owned);
  // The region holding [addr, addr+length) whole, host or GPU.
  std::optional<Region> Find(uint64_t addr, uint64_t length) const;
  std::vector<Region> Snapshot() const;

  // The memfd of the owner's generation page (local_memory.h), which
  // same-host peers may map as they map the regions' memfds; -1 until set.
  // Set once, before any peer can ask.
  void set_control_memfd(int fd) { control_memfd_ = fd; }
  int control_memfd() const { return control_memfd_; }

 private:
  mutable std::shared_mutex mu_;
  std::map<uint64_t, Region> regions_;  // by start address; guarded by mu_
  int control_memfd_ = -1;
};

}  // namespace ferry
