#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ferry::crc32c {

namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli

// Slicing-by-8 tables: the fallback moves 8 bytes per step.
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& Table() {
  static const Tables t;
  return t;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only, as the wire format assumes
}

#if defined(__x86_64__)

// Three independent crc32 streams hide the instruction's 3-cycle latency.
// Each block's register is then advanced past the zeros of the blocks after
// it (a linear map of the register, tabulated per byte) and folded in.
constexpr size_t kLong = 4096;
constexpr size_t kShort = 256;

// x -> the register after `x` has taken in n zero bytes, as 4 byte tables.
struct Shift {
  uint32_t t[4][256];
  uint32_t operator()(uint32_t x) const {
    return t[0][x & 0xff] ^ t[1][(x >> 8) & 0xff] ^ t[2][(x >> 16) & 0xff] ^ t[3][x >> 24];
  }
};

__attribute__((target("sse4.2"))) Shift MakeShift(size_t n) {
  uint32_t bit[32];
  for (int i = 0; i < 32; ++i) {
    uint64_t c = 1u << i;
    for (size_t k = 0; k < n; k += 8) c = _mm_crc32_u64(c, 0);
    bit[i] = static_cast<uint32_t>(c);
  }
  Shift s;
  for (int b = 0; b < 4; ++b) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint32_t x = 0;
      for (int j = 0; j < 8; ++j) {
        if (v & (1u << j)) x ^= bit[8 * b + j];
      }
      s.t[b][v] = x;
    }
  }
  return s;
}

struct Shifts {
  Shift by_long = MakeShift(kLong);
  Shift by_short = MakeShift(kShort);
};

const Shifts& ShiftTables() {
  static const Shifts s;
  return s;
}

template <size_t kBlock>
__attribute__((target("sse4.2"))) uint64_t ThreeWay(uint64_t c, const uint8_t* p,
                                                    const Shift& shift) {
  uint64_t c1 = 0, c2 = 0;
  for (size_t i = 0; i < kBlock; i += 8) {
    c = _mm_crc32_u64(c, Load64(p + i));
    c1 = _mm_crc32_u64(c1, Load64(p + kBlock + i));
    c2 = _mm_crc32_u64(c2, Load64(p + 2 * kBlock + i));
  }
  uint32_t r = shift(static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1);
  return shift(r) ^ static_cast<uint32_t>(c2);
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  const Shifts& s = ShiftTables();
  for (; n >= 3 * kLong; p += 3 * kLong, n -= 3 * kLong) c = ThreeWay<kLong>(c, p, s.by_long);
  for (; n >= 3 * kShort; p += 3 * kShort, n -= 3 * kShort) c = ThreeWay<kShort>(c, p, s.by_short);
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, Load64(p));
  for (; n > 0; --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}

#endif

}  // namespace

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const auto& t = Table().t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v = Load64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; --n) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

bool Accelerated() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (Accelerated()) return ExtendHardware(crc, static_cast<const uint8_t*>(data), n);
#endif
  return ExtendPortable(crc, data, n);
}

}  // namespace ferry::crc32c
