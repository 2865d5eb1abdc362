// The highest master term a process has seen (MasterOptions::term): an
// answer from an older term comes from a deposed master, and is refused
// before anything in it is used. One fence may serve several MasterClients
// (one per master a process follows). Thread safe; never blocks.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "ferry/status.h"

namespace ferry::store {

class TermFence {
 public:
  // OK, remembering `term` when it is the highest yet; Unavailable when a
  // higher one was seen (a retry should go to the current master).
  Status Observe(uint64_t term) {
    uint64_t seen = highest_.load(std::memory_order_acquire);
    while (term > seen) {
      if (highest_.compare_exchange_weak(seen, term, std::memory_order_acq_rel))
        return Status::Ok();
    }
    if (term == seen) return Status::Ok();
    return Status::Unavailable("the master's term " + std::to_string(term) +
                               " is older than the term " + std::to_string(seen) +
                               " already seen: it was deposed, and its answer is refused");
  }
  uint64_t highest() const { return highest_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint64_t> highest_{0};
};

}  // namespace ferry::store
