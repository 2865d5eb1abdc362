// What the libFuzzer targets in tests/fuzz share: a check that reports a
// broken property as a crash (libFuzzer keeps the input), little-endian
// field access for rewriting inputs, and quiet logs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// A property of the code under test failed: print why and abort, so that
// libFuzzer saves the input as a crash.
#define FUZZ_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                   \
      std::fputc('\n', stderr);                                                            \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace ferry::fuzz {

inline uint64_t GetLe(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

inline void PutLe(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Every rejected input is logged as a warning, which would cost more than
// the decoding itself; FERRY_LOG_LEVEL still wins when set.
inline void QuietLogs() { setenv("FERRY_LOG_LEVEL", "off", /*overwrite=*/0); }

}  // namespace ferry::fuzz
