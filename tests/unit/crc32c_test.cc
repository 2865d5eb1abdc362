// CRC-32C: the standard check value, the instruction path against the
// table, and a message summed in pieces against the whole.
#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace ferry {
namespace {

TEST(Crc32c, MatchesTheCheckValueAndTheTableAtEveryLength) {
  EXPECT_EQ(crc32c::Value("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c::ExtendPortable(0, "123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c::Value(nullptr, 0), 0u);
  std::vector<uint8_t> buf(40000);
  uint64_t x = 88172645463325252ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  // Around the 3-way block sizes (3 x 256, 3 x 4096), at unaligned starts.
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{767}, size_t{768}, size_t{769},
                   size_t{12287}, size_t{12288}, size_t{12289}, size_t{39990}}) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{5}}) {
      const uint32_t whole = crc32c::Value(buf.data() + off, n);
      EXPECT_EQ(whole, crc32c::ExtendPortable(0, buf.data() + off, n)) << n << "+" << off;
      const size_t k = n / 3;
      EXPECT_EQ(whole,
                crc32c::Extend(crc32c::Value(buf.data() + off, k), buf.data() + off + k, n - k))
          << n << "+" << off;
    }
  }
  // One bit flipped anywhere changes the sum.
  const uint32_t sum = crc32c::Value(buf.data(), buf.size());
  buf[12345] ^= 0x10;
  EXPECT_NE(crc32c::Value(buf.data(), buf.size()), sum);
}

}  // namespace
}  // namespace ferry
