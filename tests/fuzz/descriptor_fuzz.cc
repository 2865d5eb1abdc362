// The segment descriptor (transfer/descriptor.h), as a peer's listener sends
// it. Input either decodes, and then encodes back to exactly the same bytes
// (the format has one spelling per descriptor) and answers lookups as a
// plain scan of its regions does, or is refused with ProtocolError.
#include <vector>

#include "fuzz.h"
#include "transfer/descriptor.h"

using namespace ferry;

namespace {

// What Find must answer: the region holding [addr, addr+length) whole.
const RegionDesc* Scan(const SegmentDescriptor& d, uint64_t addr, uint64_t length) {
  if (length == 0 || addr + length < addr) return nullptr;
  for (const auto& r : d.regions) {
    if (addr >= r.addr && addr + length <= r.addr + r.length) return &r;
  }
  return nullptr;
}

void CheckFind(const SegmentDescriptor& d, uint64_t addr, uint64_t length) {
  FUZZ_CHECK(d.Find(addr, length) == Scan(d, addr, length), "Find(0x%llx, %llu)",
             static_cast<unsigned long long>(addr), static_cast<unsigned long long>(length));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto d = DecodeDescriptor(data, size);
  if (!d.ok()) {
    FUZZ_CHECK(d.status().code() == StatusCode::kProtocolError, "%s",
               d.status().ToString().c_str());
    return 0;
  }
  const SegmentDescriptor& desc = d.value();
  const std::vector<uint8_t> again = EncodeDescriptor(desc);
  FUZZ_CHECK(again.size() == size && std::equal(again.begin(), again.end(), data),
             "a decoded descriptor encodes to %zu other bytes (of %zu)", again.size(), size);
  FUZZ_CHECK(desc.transport_blobs.size() == desc.transports.size(), "segment blobs");
  for (const auto& r : desc.regions) {
    FUZZ_CHECK(r.blobs.size() == desc.transports.size(), "region blobs");
    // The edges of every region, and ranges that run past them.
    CheckFind(desc, r.addr, r.length);
    CheckFind(desc, r.addr, r.length + 1);
    CheckFind(desc, r.addr - 1, 2);
    CheckFind(desc, r.addr + r.length - 1, 1);
    CheckFind(desc, r.addr + r.length, 1);
    CheckFind(desc, r.addr, ~uint64_t{0});
    for (const auto& t : desc.transports) (void)desc.BlobOf(r, t);
  }
  for (const auto& t : desc.transports) (void)desc.SegmentBlobOf(t);
  return 0;
}
