// The tcp frame header: packed little-endian, every field validated.
#include <gtest/gtest.h>

#include <asio.hpp>  // after standard headers: see asio_first.cc
#include <string>

#ifdef ASIO_HAS_STD_ALIGNED_ALLOC
#error "asio's aligned allocation must be disabled for every file; see CMakeLists.txt"
#endif

#include "common/bytes.h"
#include "transfer/frame_wire.h"

namespace ferry {
namespace {

TEST(Wire, HeaderIsPackedLittleEndianAndValidated) {
  uint8_t h[wire::kHeaderSize];
  memset(h, 0xee, sizeof(h));
  wire::EncodeHeader({wire::Opcode::kWrite, StatusCode::kOutOfRange, 0x1122, 0xdeadbeef, 4096}, h);
  EXPECT_EQ(h[0], 0x46);  // 'F'
  EXPECT_EQ(h[4], wire::kVersion);
  EXPECT_EQ(h[7], 0);  // reserved byte is written, never left uninitialised
  EXPECT_EQ(h[8], 0x22);
  auto d = wire::DecodeHeader(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value().opcode, wire::Opcode::kWrite);
  EXPECT_EQ(d.value().status, StatusCode::kOutOfRange);
  EXPECT_EQ(d.value().id, 0x1122u);
  EXPECT_EQ(d.value().addr, 0xdeadbeefu);
  EXPECT_EQ(d.value().length, 4096u);
  for (int byte : {0, 4, 5, 6, 7}) {
    uint8_t bad[wire::kHeaderSize];
    memcpy(bad, h, sizeof(bad));
    bad[byte] = 0xff;
    EXPECT_EQ(wire::DecodeHeader(bad).status().code(), StatusCode::kProtocolError) << byte;
  }
}

}  // namespace
}  // namespace ferry
