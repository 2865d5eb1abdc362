// The registry of local memory, and segment names.
#include "transfer/memory_registry.h"

#include <gtest/gtest.h>

#include <string>

#include "transfer/metadata.h"

namespace ferry {
namespace {

Region R(uint64_t addr, uint64_t length) {
  Region r;
  r.addr = addr;
  r.length = length;
  return r;
}

TEST(MemoryRegistry, OverlapsAreRejectedAndContainsIsExact) {
  MemoryRegistry reg;
  ASSERT_TRUE(reg.Add(R(0x10000, 0x1000)).ok());
  EXPECT_EQ(reg.Add(R(0x10000, 1)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0xffff, 2)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0x10fff, 5)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0x8000, 0x10000)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0x20000, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Add(R(~0ull - 10, 100)).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(reg.Add(R(0x11000, 0x1000)).ok());  // adjacent
  EXPECT_TRUE(reg.Find(0x10000, 0x1000).has_value());
  EXPECT_TRUE(reg.Find(0x10fff, 1).has_value());
  EXPECT_FALSE(reg.Find(0x10fff, 2).has_value());  // spans two registrations
  EXPECT_FALSE(reg.Find(0xfff, 1).has_value());
  EXPECT_FALSE(reg.Find(0x10000, 0).has_value());
  EXPECT_FALSE(reg.Find(0x10000, ~0ull).has_value());
  EXPECT_EQ(reg.Remove(0x10001, false).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg.Remove(0x10000, true).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(reg.Find(0x10000, 1).has_value()) << "a refused removal leaves the region";
  EXPECT_TRUE(reg.Remove(0x10000, false).ok());
  EXPECT_FALSE(reg.Find(0x10000, 1).has_value());
  EXPECT_EQ(reg.Snapshot().size(), 1u);
}

TEST(SegmentName, Parsing) {
  auto a = ParseSegmentName("127.0.0.1:5000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().host, "127.0.0.1");
  EXPECT_EQ(a.value().port, 5000);
  auto v6 = ParseSegmentName("[::1]:7");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6.value().host, "::1");
  for (const char* bad : {"", ":", "1.2.3.4", "1.2.3.4:", ":80", "1.2.3.4:0", "1.2.3.4:65536",
                          "1.2.3.4:8x", "host:80", "1.2.3.4:-1"}) {
    EXPECT_EQ(ParseSegmentName(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ferry
