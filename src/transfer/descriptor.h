// A segment descriptor: what a peer needs to reach this process's memory.
// Fetched over the listener (p2p metadata) and cached by the peer until the
// epoch changes or, for same-host peers, the owner unregisters memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry {

// The size of the page behind SegmentDescriptor::control_memfd; the
// generation is its first word.
inline constexpr uint64_t kGenerationPageBytes = 4096;

struct RegionDesc {
  uint64_t addr = 0;
  uint64_t length = 0;
  int32_t memfd = -1;       // the owner's fd number; same-host peers open /proc/<pid>/fd/<n>
  uint8_t kind = 0;         // gpu::MemoryKind: host pageable, host pinned or device
  int32_t device = -1;      // the owner's GPU index for device memory
  std::string ipc;          // device memory: CUDA IPC handle of the allocation, or empty
  uint64_t ipc_offset = 0;  // addr minus the allocation's base
  // Unique per registration in the owner's process: a region unregistered and
  // registered again, even at the same address and fd number, gets a new one,
  // so peers never mistake it for the mapping they hold.
  uint64_t serial = 0;
};

struct SegmentDescriptor {
  uint64_t epoch = 0;   // random per process start, never 0
  std::string host_id;  // see HostIdentity()
  uint32_t pid = 0;
  // The owner's registration generation when this was made, and the memfd of
  // the page where it counts on (same-host peers map it: segment.h).
  uint64_t generation = 0;
  int32_t control_memfd = -1;
  std::vector<std::string> transports;  // what the owner serves, e.g. "tcp", "shm"
  std::vector<RegionDesc> regions;      // sorted by addr, non-overlapping

  // The region holding [addr, addr+length) whole, or nullptr.
  const RegionDesc* Find(uint64_t addr, uint64_t length) const;
  bool Offers(const std::string& transport) const;
};

inline constexpr size_t kMaxDescriptorBytes = 4 << 20;
inline constexpr size_t kMaxDescriptorRegions = 1 << 16;

std::vector<uint8_t> EncodeDescriptor(const SegmentDescriptor& d);
// ProtocolError for truncated, oversized, unsorted or overlapping input.
Result<SegmentDescriptor> DecodeDescriptor(const uint8_t* data, size_t size);

}  // namespace ferry
