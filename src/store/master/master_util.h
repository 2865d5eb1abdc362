// What the master's source files share and nothing else needs.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "store/master/allocator.h"
#include "store/master/space.h"

// Adds n to the master's counter `field`; inside Master's members only.
#define FERRY_COUNT(field, n)      \
  do {                             \
    std::lock_guard _l(stats_mu_); \
    counters_.field += (n);        \
  } while (0)

namespace ferry::store {

// The bytes an allocation holds, as the allocator rounds them.
inline uint64_t Bytes(const Allocation& a) {
  uint64_t n = 0;
  for (const auto& e : a.extents) n += OffsetAllocator::RoundUp(e.length);
  return n;
}

inline uint64_t Bytes(const std::vector<Allocation>& replicas) {
  uint64_t n = 0;
  for (const auto& a : replicas) n += Bytes(a);
  return n;
}

}  // namespace ferry::store
