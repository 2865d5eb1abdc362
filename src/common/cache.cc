#include "common/cache.h"

#include <cstdint>

#include "common/env.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ferry {
namespace {

constexpr const char* kWriteBackEnv = "FERRY_STAGING_WRITEBACK";

#if defined(__x86_64__)
bool HasClwb() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  return (b >> 24) & 1;  // CPUID.(EAX=7,ECX=0):EBX[24]
}

constexpr uintptr_t kLine = 64;

__attribute__((target("clwb"))) void Clwb(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + n;
  for (; a < end; a += kLine) __builtin_ia32_clwb(reinterpret_cast<void*>(a));
  __builtin_ia32_sfence();  // the write-backs are ordered before the DMA is started
}

#endif

}  // namespace

void WriteBackForDma(const void* p, size_t n) {
#if defined(__x86_64__)
  static const bool on = HasClwb() && [] {
    Result<int64_t> v = env::GetInt(kWriteBackEnv, 1);
    return !v.ok() || v.value() != 0;
  }();
  if (on && n > 0) Clwb(p, n);
#else
  (void)p;
  (void)n;
#endif
}

Status CheckWriteBackEnv() { return env::GetInt(kWriteBackEnv, 1).status(); }

}  // namespace ferry
