// The master's space: the offset allocator and placement over nodes.
#include "store/master/allocator.h"

#include <gtest/gtest.h>

#include <set>

#include "store/master/space.h"

namespace ferry::store {
namespace {

TEST(OffsetAllocator, AllocatesAlignedAndMergesOnFree) {
  OffsetAllocator a(1024);
  auto x = a.Allocate(100);  // rounds to 128
  auto y = a.Allocate(64);
  auto z = a.Allocate(1);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x % OffsetAllocator::kAlign, 0u);
  EXPECT_EQ(*y % OffsetAllocator::kAlign, 0u);
  EXPECT_EQ(a.free_bytes(), 1024u - 128 - 64 - 64);
  a.Free(*y, 64);
  a.Free(*x, 100);
  a.Free(*z, 1);
  EXPECT_EQ(a.free_bytes(), 1024u);
  EXPECT_EQ(a.largest_free(), 1024u);  // fully merged again
}

TEST(OffsetAllocator, FailsWhenNoBlockIsLargeEnoughAndPicksBestFit) {
  OffsetAllocator a(64 * 10);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 10; ++i) offs.push_back(*a.Allocate(64));
  EXPECT_FALSE(a.Allocate(1).has_value());
  a.Free(offs[1], 64);  // a 64-byte hole
  a.Free(offs[4], 64);  // and a 192-byte one
  a.Free(offs[5], 64);
  a.Free(offs[6], 64);
  EXPECT_FALSE(a.Allocate(256).has_value());
  EXPECT_EQ(*a.Allocate(64), offs[1]);  // the smallest hole that fits
  EXPECT_EQ(*a.Allocate(192), offs[4]);
  EXPECT_FALSE(a.Allocate(0).has_value());
}

TEST(Space, PlacesReplicasOnDistinctNodesPreferredFirst) {
  Space s;
  uint64_t replaced = 0;
  ASSERT_TRUE(s.Mount("a:1", 1, {{1 << 20, 1 << 20}}, &replaced).ok());
  ASSERT_TRUE(s.Mount("b:1", 1, {{1 << 20, 1 << 20}}, &replaced).ok());
  ASSERT_TRUE(s.Mount("c:1", 1, {{1 << 20, 1 << 20}}, &replaced).ok());
  for (const char* pref : {"a:1", "b:1", "c:1"}) {
    auto r = s.Allocate({4096, 3, pref});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::set<std::string> nodes;
    for (const auto& a : r.value()) nodes.insert(a.node);
    EXPECT_EQ(nodes.size(), 3u);
    EXPECT_EQ(r.value()[0].node, pref);
  }
  EXPECT_EQ(s.Allocate({4096, 4, ""}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.Allocate({2 << 20, 1, ""}).status().code(), StatusCode::kResourceExhausted);
}

TEST(Space, SplitsAReplicaOverFreeBlocksWhenFragmented) {
  Space s;
  uint64_t replaced = 0;
  ASSERT_TRUE(s.Mount("a:1", 1, {{1 << 20, 4096}}, &replaced).ok());
  std::vector<Allocation> held;
  for (int i = 0; i < 4; ++i) held.push_back(s.Allocate({1024, 1, ""}).value()[0]);
  s.Free(held[0]);
  s.Free(held[2]);  // two 1 KiB holes, not adjacent
  auto r = s.Allocate({2048, 1, ""});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r.value()[0].extents.size(), 2u);
  EXPECT_EQ(r.value()[0].extents[0].length + r.value()[0].extents[1].length, 2048u);
  EXPECT_EQ(s.Usage().used, 4096u);
}

TEST(Space, RemountGetsANewGenerationAndIgnoresStaleFrees) {
  Space s;
  uint64_t replaced = 0;
  auto g1 = s.Mount("a:1", 1, {{1 << 20, 4096}}, &replaced);
  auto old = s.Allocate({4096, 1, ""}).value()[0];
  auto g2 = s.Mount("a:1", 1, {{1 << 20, 4096}}, &replaced);
  EXPECT_EQ(replaced, g1.value());
  EXPECT_NE(g1.value(), g2.value());
  auto fresh = s.Allocate({4096, 1, ""});
  ASSERT_TRUE(fresh.ok());
  s.Free(old);  // from the old mount: must not free the new allocation's space
  EXPECT_EQ(s.Allocate({64, 1, ""}).status().code(), StatusCode::kResourceExhausted);
}

TEST(Space, RejectsBadRegions) {
  Space s;
  uint64_t replaced = 0;
  EXPECT_EQ(s.Mount("a:1", 1, {}, &replaced).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Mount("a:1", 0, {{4096, 4096}}, &replaced).status().code(),
            StatusCode::kInvalidArgument);  // no epoch
  EXPECT_EQ(s.Mount("a:1", 1, {{0, 4096}}, &replaced).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Mount("a:1", 1, {{~0ull - 100, 4096}}, &replaced).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Mount("a:1", 1, {{4096, 8192}, {8192, 4096}}, &replaced).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Usage().nodes, 0u);
}

}  // namespace
}  // namespace ferry::store
