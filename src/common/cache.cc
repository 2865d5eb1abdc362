#include "common/cache.h"

#include <cstdint>
#include <string>

#include "common/env.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ferry {
namespace {

constexpr const char* kWriteBackEnv = "FERRY_STAGING_WRITEBACK";
constexpr int kDefaultMode = 4;

#if defined(__x86_64__)
// CPUID.(EAX=7,ECX=0): EBX bit 24 is CLWB, 23 CLFLUSHOPT; ECX bit 25 CLDEMOTE.
bool HasLeaf7(bool in_ecx, int bit) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  return ((in_ecx ? c : b) >> bit) & 1;
}

bool HasClwb() { return HasLeaf7(false, 24); }
bool HasClflushOpt() { return HasLeaf7(false, 23); }
bool HasCldemote() { return HasLeaf7(true, 25); }

constexpr uintptr_t kLine = 64;

__attribute__((target("clwb"))) void Clwb(const void* p, size_t n, bool fence) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + n;
  for (; a < end; a += kLine) __builtin_ia32_clwb(reinterpret_cast<void*>(a));
  if (fence) __builtin_ia32_sfence();  // the write-backs are ordered before the DMA is started
}

__attribute__((target("clflushopt"))) void ClflushOpt(const void* p, size_t n, bool fence) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + n;
  for (; a < end; a += kLine) __builtin_ia32_clflushopt(reinterpret_cast<void*>(a));
  if (fence) __builtin_ia32_sfence();
}

// A hint, with nothing to wait for: no fence.
__attribute__((target("cldemote"))) void Cldemote(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + n;
  for (; a < end; a += kLine) __builtin_ia32_cldemote(reinterpret_cast<void*>(a));
}

#endif

Result<int64_t> ModeFromEnv() {
  FERRY_ASSIGN_OR_RETURN(int64_t v, env::GetInt(kWriteBackEnv, kDefaultMode));
  if (v < 0 || v > 4) {
    return Status::InvalidArgument(std::string(kWriteBackEnv) + " must be 0 to 4, not " +
                                   std::to_string(v));
  }
  return v;
}

}  // namespace

int DmaWriteBackMode() {
#if defined(__x86_64__)
  static const int mode = [] {
    Result<int64_t> v = ModeFromEnv();
    const int want = v.ok() ? static_cast<int>(v.value()) : kDefaultMode;
    if (want == 2) return HasClflushOpt() ? 2 : 0;
    if (want == 3) return HasCldemote() ? 3 : 0;
    if (want == 0 || !HasClwb()) return 0;
    return want;
  }();
  return mode;
#else
  return 0;
#endif
}

namespace {

void WriteBack(const void* p, size_t n, bool own, bool fence) {
#if defined(__x86_64__)
  static const bool demote_own = HasCldemote();
  if (n == 0) return;
  switch (DmaWriteBackMode()) {
    case 1: return Clwb(p, n, fence);
    case 2: return ClflushOpt(p, n, fence);
    case 3: return Cldemote(p, n);
    case 4: return own && demote_own ? Cldemote(p, n) : Clwb(p, n, fence);
    default: return;
  }
#else
  (void)p;
  (void)n;
  (void)own;
  (void)fence;
#endif
}

}  // namespace

void WriteBackForDma(const void* p, size_t n) { WriteBack(p, n, false, true); }

void WriteBackOwnForDma(const void* p, size_t n) { WriteBack(p, n, true, true); }

void WriteBackOwnForDmaUnfenced(const void* p, size_t n) { WriteBack(p, n, true, false); }

Status CheckWriteBackEnv() { return ModeFromEnv().status(); }

}  // namespace ferry
