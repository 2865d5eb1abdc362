#include "transfer/descriptor.h"

#include <algorithm>

#include "common/bytes.h"
#include "gpu/gpu.h"

namespace ferry {

namespace {
constexpr uint32_t kDescriptorMagic = 0x33534446;  // "FDS3"
constexpr size_t kMaxString = 256;
constexpr size_t kMaxIpcHandle = 64;
constexpr uint64_t kMinRegionBytes = 8 + 8 + 4 + 1 + 4 + 4 + 8 + 8;
}  // namespace

const RegionDesc* SegmentDescriptor::Find(uint64_t addr, uint64_t length) const {
  if (length == 0 || addr + length < addr) return nullptr;
  auto it = std::upper_bound(regions.begin(), regions.end(), addr,
                             [](uint64_t a, const RegionDesc& r) { return a < r.addr; });
  if (it == regions.begin()) return nullptr;
  --it;
  return addr + length <= it->addr + it->length ? &*it : nullptr;
}

bool SegmentDescriptor::Offers(const std::string& transport) const {
  return std::find(transports.begin(), transports.end(), transport) != transports.end();
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
  for (const auto& t : d.transports) w.Str(t);
  w.U32(static_cast<uint32_t>(d.regions.size()));
  for (const auto& r : d.regions) {
    w.U64(r.addr);
    w.U64(r.length);
    w.I32(r.memfd);
    w.U8(r.kind);
    w.I32(r.device);
    w.Str(r.ipc);
    w.U64(r.ipc_offset);
    w.U64(r.serial);
  }
  return out;
}

Result<SegmentDescriptor> DecodeDescriptor(const uint8_t* data, size_t size) {
  auto bad = [](const char* why) {
    return Status(StatusCode::kProtocolError, std::string("bad segment descriptor: ") + why);
  };
  if (size > kMaxDescriptorBytes) return bad("too large");
  ByteReader r(data, size);
  if (r.U32() != kDescriptorMagic) return bad("wrong magic");
  SegmentDescriptor d;
  d.epoch = r.U64();
  d.host_id = r.Str(kMaxString);
  d.pid = r.U32();
  d.generation = r.U64();
  d.control_memfd = r.I32();
  uint32_t nt = r.U32();
  if (!r.ok() || nt > 16) return bad("transport list");
  for (uint32_t i = 0; i < nt; ++i) d.transports.push_back(r.Str(kMaxString));
  uint32_t nr = r.U32();
  if (!r.ok() || nr > kMaxDescriptorRegions || nr * kMinRegionBytes > r.Left())
    return bad("region count");
  d.regions.resize(nr);
  for (auto& reg : d.regions) {
    reg.addr = r.U64();
    reg.length = r.U64();
    reg.memfd = r.I32();
    reg.kind = r.U8();
    reg.device = r.I32();
    reg.ipc = r.Str(kMaxIpcHandle);
    reg.ipc_offset = r.U64();
    reg.serial = r.U64();
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
