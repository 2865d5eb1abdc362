// The segment descriptor codec: round trips, and every truncation and corruption refused.
#include "transfer/descriptor.h"

#include <gtest/gtest.h>

#include <string>

#include "common/bytes.h"

namespace ferry {
namespace {

SegmentDescriptor Sample() {
  SegmentDescriptor d;
  d.epoch = 99;
  d.host_id = "boot/4026531836";
  d.pid = 1234;
  d.generation = 0x0102030405060708;
  d.control_memfd = 9;
  d.transports = {"tcp", "shm"};
  d.transport_blobs = {"", "segment-wide"};
  RegionDesc a, b;
  a.addr = 0x1000;
  a.length = 0x1000;
  a.allocated = true;
  a.blobs = {"", std::string("\x07\0\0\0", 4)};
  b.addr = 0x3000;
  b.length = 0x100;
  b.kind = 2;  // device memory
  b.device = 1;
  b.serial = 0x1122334455667788;
  b.blobs = {std::string(kMaxRegionBlob, 'h'), ""};
  d.regions = {a, b};
  return d;
}

TEST(Descriptor, RoundTripAndLookup) {
  auto bytes = EncodeDescriptor(Sample());
  auto d = DecodeDescriptor(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d.value().epoch, 99u);
  EXPECT_EQ(d.value().host_id, "boot/4026531836");
  EXPECT_EQ(d.value().generation, 0x0102030405060708u);
  EXPECT_EQ(d.value().control_memfd, 9);
  EXPECT_EQ(d.value().regions.size(), 2u);
  EXPECT_TRUE(d.value().regions[0].allocated);
  EXPECT_FALSE(d.value().regions[1].allocated);
  EXPECT_EQ(d.value().regions[1].kind, 2);
  EXPECT_EQ(d.value().regions[1].device, 1);
  EXPECT_EQ(d.value().regions[1].serial, 0x1122334455667788u);
  // Each transport's blobs come back as it wrote them, and only to it.
  const RegionDesc& ra = d.value().regions[0];
  const RegionDesc& rb = d.value().regions[1];
  EXPECT_EQ(d.value().BlobOf(ra, "shm"), std::string("\x07\0\0\0", 4));
  EXPECT_EQ(d.value().BlobOf(ra, "tcp"), "");
  EXPECT_EQ(d.value().BlobOf(rb, "tcp"), std::string(kMaxRegionBlob, 'h'));
  EXPECT_EQ(d.value().BlobOf(rb, "cuda_ipc"), "") << "not offered";
  EXPECT_EQ(d.value().SegmentBlobOf("shm"), "segment-wide");
  EXPECT_EQ(d.value().SegmentBlobOf("tcp"), "");
  EXPECT_TRUE(d.value().Offers("shm"));
  EXPECT_FALSE(d.value().Offers("cuda_ipc"));
  EXPECT_NE(d.value().Find(0x1000, 0x1000), nullptr);
  EXPECT_EQ(d.value().Find(0x1fff, 2), nullptr);  // crosses the end
  EXPECT_EQ(d.value().Find(0x2000, 1), nullptr);  // gap
  EXPECT_EQ(d.value().Find(0x3050, 0xb0)->addr, 0x3000u);
  EXPECT_EQ(d.value().Find(0x3000, 0), nullptr);
  EXPECT_EQ(d.value().Find(~0ull - 4, 10), nullptr);  // wraps
}

TEST(Descriptor, EveryTruncationAndCorruptionIsRejected) {
  auto bytes = EncodeDescriptor(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeDescriptor(bytes.data(), n).status().code(), StatusCode::kProtocolError) << n;
  }
  auto extra = bytes;
  extra.push_back(0);
  EXPECT_FALSE(DecodeDescriptor(extra.data(), extra.size()).ok());
  SegmentDescriptor overlap = Sample();
  overlap.regions[1].addr = 0x1800;
  auto ob = EncodeDescriptor(overlap);
  EXPECT_FALSE(DecodeDescriptor(ob.data(), ob.size()).ok());
  SegmentDescriptor kind = Sample();
  kind.regions[0].kind = 3;  // no such memory kind
  auto kb = EncodeDescriptor(kind);
  EXPECT_FALSE(DecodeDescriptor(kb.data(), kb.size()).ok());
  SegmentDescriptor blob = Sample();
  blob.regions[1].blobs[0] = std::string(kMaxRegionBlob + 1, 'h');  // over a transport's limit
  auto bb = EncodeDescriptor(blob);
  EXPECT_FALSE(DecodeDescriptor(bb.data(), bb.size()).ok());
  SegmentDescriptor zero = Sample();
  zero.epoch = 0;
  auto zb = EncodeDescriptor(zero);
  EXPECT_FALSE(DecodeDescriptor(zb.data(), zb.size()).ok());
  // A region count far beyond the bytes present must not allocate or read past.
  std::vector<uint8_t> huge = EncodeDescriptor(SegmentDescriptor{1, "h", 1, 0, -1, {}, {}, {}});
  huge[huge.size() - 1] = 0x7f;
  EXPECT_FALSE(DecodeDescriptor(huge.data(), huge.size()).ok());
}

// A peer of another descriptor format is refused by name, not misread.
TEST(Descriptor, OtherFormatsAreRefusedClearly) {
  auto bytes = EncodeDescriptor(Sample());
  ASSERT_EQ(bytes[3], '0' + kDescriptorFormat);
  bytes[3] = '3';  // the format before per-transport blobs
  auto old = DecodeDescriptor(bytes.data(), bytes.size());
  EXPECT_EQ(old.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(old.status().message().find("format 3"), std::string::npos) << old.status().ToString();
  bytes[0] = 'X';
  EXPECT_NE(DecodeDescriptor(bytes.data(), bytes.size()).status().message().find("wrong magic"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry
