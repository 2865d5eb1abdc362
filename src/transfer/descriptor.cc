#include "transfer/descriptor.h"

#include <algorithm>

#include "common/bytes.h"
#include "gpu/gpu.h"

namespace ferry {

namespace {
// "FDS" and the format digit, little-endian: "FDS4".
constexpr uint32_t kMagicPrefix = 0x00534446;
constexpr uint32_t kDescriptorMagic = kMagicPrefix | (uint32_t{'0' + kDescriptorFormat} << 24);
constexpr size_t kMaxString = 256;
constexpr uint64_t kMinRegionBytes = 8 + 8 + 1 + 1 + 4 + 8;
constexpr uint8_t kAllocated = 1;  // region flags
}  // namespace

const RegionDesc* SegmentDescriptor::Find(uint64_t addr, uint64_t length) const {
  if (length == 0 || addr + length < addr) return nullptr;
  auto it = std::upper_bound(regions.begin(), regions.end(), addr,
                             [](uint64_t a, const RegionDesc& r) { return a < r.addr; });
  if (it == regions.begin()) return nullptr;
  --it;
  return addr + length <= it->addr + it->length ? &*it : nullptr;
}

bool SegmentDescriptor::Offers(std::string_view transport) const {
  return std::find(transports.begin(), transports.end(), transport) != transports.end();
}

std::string_view SegmentDescriptor::BlobOf(const RegionDesc& region,
                                           std::string_view transport) const {
  auto it = std::find(transports.begin(), transports.end(), transport);
  const size_t i = static_cast<size_t>(it - transports.begin());
  return i < region.blobs.size() ? std::string_view(region.blobs[i]) : std::string_view();
}

std::string_view SegmentDescriptor::SegmentBlobOf(std::string_view transport) const {
  auto it = std::find(transports.begin(), transports.end(), transport);
  const size_t i = static_cast<size_t>(it - transports.begin());
  return i < transport_blobs.size() ? std::string_view(transport_blobs[i]) : std::string_view();
}

std::vector<uint8_t> EncodeDescriptor(const SegmentDescriptor& d) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(kDescriptorMagic);
  w.U64(d.epoch);
  w.Str(d.host_id);
  w.U32(d.pid);
  w.U64(d.generation);
  w.I32(d.control_memfd);
  w.U32(static_cast<uint32_t>(d.transports.size()));
  for (size_t i = 0; i < d.transports.size(); ++i) {
    w.Str(d.transports[i]);
    w.Str(i < d.transport_blobs.size() ? std::string_view(d.transport_blobs[i])
                                       : std::string_view());
  }
  w.U32(static_cast<uint32_t>(d.regions.size()));
  for (const auto& r : d.regions) {
    w.U64(r.addr);
    w.U64(r.length);
    w.U8(r.kind);
    w.U8(r.allocated ? kAllocated : 0);
    w.I32(r.device);
    w.U64(r.serial);
    for (size_t i = 0; i < d.transports.size(); ++i) {
      w.Str(i < r.blobs.size() ? std::string_view(r.blobs[i]) : std::string_view());
    }
  }
  return out;
}

Result<SegmentDescriptor> DecodeDescriptor(const uint8_t* data, size_t size) {
  auto bad = [](const std::string& why) {
    return Status::ProtocolError("bad segment descriptor: " + why);
  };
  if (size > kMaxDescriptorBytes) return bad("too large");
  ByteReader r(data, size);
  const uint32_t magic = r.U32();
  if (magic != kDescriptorMagic) {
    const char format = static_cast<char>(magic >> 24);
    if ((magic & 0x00ffffff) == kMagicPrefix && format >= '0' && format <= '9') {
      return bad(std::string("format ") + format +
                 " from another version of Ferry; this one reads " +
                 std::to_string(kDescriptorFormat));
    }
    return bad("wrong magic");
  }
  SegmentDescriptor d;
  d.epoch = r.U64();
  d.host_id = r.Str(kMaxString);
  d.pid = r.U32();
  d.generation = r.U64();
  d.control_memfd = r.I32();
  uint32_t nt = r.U32();
  if (!r.ok() || nt > kMaxDescriptorTransports) return bad("transport list");
  for (uint32_t i = 0; i < nt; ++i) {
    d.transports.push_back(r.Str(kMaxString));
    d.transport_blobs.push_back(r.Str(kMaxSegmentBlob));
  }
  uint32_t nr = r.U32();
  if (!r.ok() || nr > kMaxDescriptorRegions || nr * (kMinRegionBytes + 4 * nt) > r.Left())
    return bad("region count");
  d.regions.resize(nr);
  for (auto& reg : d.regions) {
    reg.addr = r.U64();
    reg.length = r.U64();
    reg.kind = r.U8();
    const uint8_t flags = r.U8();
    reg.allocated = (flags & kAllocated) != 0;
    reg.device = r.I32();
    reg.serial = r.U64();
    if (flags & ~kAllocated) return bad("unknown region flags");
    reg.blobs.resize(nt);
    for (auto& b : reg.blobs) b = r.Str(kMaxRegionBlob);
    if (!r.ok()) return bad("truncated");
  }
  if (!r.ok()) return bad("truncated");
  if (r.Left() != 0) return bad("trailing bytes");
  if (d.epoch == 0) return bad("zero epoch");
  for (size_t i = 0; i < d.regions.size(); ++i) {
    const auto& g = d.regions[i];
    if (g.length == 0 || g.addr + g.length < g.addr) return bad("empty or wrapping region");
    if (g.kind > static_cast<uint8_t>(gpu::MemoryKind::kDevice)) return bad("unknown memory kind");
    if (i > 0 && d.regions[i - 1].addr + d.regions[i - 1].length > g.addr) {
      return bad("unsorted or overlapping regions");
    }
  }
  return d;
}

}  // namespace ferry
