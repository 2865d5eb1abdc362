// A segment descriptor: what a peer needs to reach this process's memory.
// Fetched over the listener (p2p metadata) and cached by the peer until the
// epoch changes or, for same-host peers, the owner unregisters memory.
//
// The descriptor is transport-neutral: each region carries one opaque blob
// per offered transport, written by that transport when the memory was
// registered (Transport::DescribeMemory) and read only by its endpoints.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

// The size of the page behind SegmentDescriptor::control_memfd; the
// generation is its first word.
inline constexpr uint64_t kGenerationPageBytes = 4096;
// The largest blob a transport may attach to one region, and to the segment.
inline constexpr size_t kMaxRegionBlob = 256;
inline constexpr size_t kMaxSegmentBlob = 4096;
// The descriptor format this build writes and reads; a peer of another one
// is refused with ProtocolError, naming both.
inline constexpr uint8_t kDescriptorFormat = 4;

struct RegionDesc {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint8_t kind = 0;        // gpu::MemoryKind: host pageable, host pinned or device
  int32_t device = -1;     // the owner's GPU index for device memory
  bool allocated = false;  // by the owner's engine (Engine::AllocateMemory)
  // Unique per registration in the owner's process: a region unregistered and
  // registered again, even at the same address, gets a new one, so peers
  // never mistake it for the mapping they hold.
  uint64_t serial = 0;
  // One per entry of SegmentDescriptor::transports, in that order: what that
  // transport's endpoints need to reach the region, in its own format.
  std::vector<std::string> blobs;
};

struct SegmentDescriptor {
  uint64_t epoch = 0;   // random per process start, never 0
  std::string host_id;  // see HostIdentity()
  uint32_t pid = 0;
  // The owner's registration generation when this was made, and the memfd of
  // the page where it counts on (same-host peers map it: segment.h).
  uint64_t generation = 0;
  int32_t control_memfd = -1;
  std::vector<std::string> transports;  // the registered names of what the owner offers
  // One per entry of `transports`, in that order: what that transport's
  // endpoints need from the owner as a whole, in its own format.
  std::vector<std::string> transport_blobs;
  std::vector<RegionDesc> regions;  // sorted by addr, non-overlapping

  // The region holding [addr, addr+length) whole, or nullptr.
  const RegionDesc* Find(uint64_t addr, uint64_t length) const;
  bool Offers(std::string_view transport) const;
  // What `transport` wrote for `region` (one of `regions`); empty when it
  // wrote nothing or is not offered.
  std::string_view BlobOf(const RegionDesc& region, std::string_view transport) const;
  // What `transport` wrote for the segment; empty likewise.
  std::string_view SegmentBlobOf(std::string_view transport) const;
};

inline constexpr size_t kMaxDescriptorBytes = 4 << 20;
inline constexpr size_t kMaxDescriptorRegions = 1 << 16;
inline constexpr size_t kMaxDescriptorTransports = 16;

std::vector<uint8_t> EncodeDescriptor(const SegmentDescriptor& d);
// ProtocolError for another format, truncated, oversized, unsorted or
// overlapping input, or blobs that do not match the transport list.
Result<SegmentDescriptor> DecodeDescriptor(const uint8_t* data, size_t size);

}  // namespace ferry
