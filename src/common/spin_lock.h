// A lock for critical sections of a few hundred nanoseconds that several
// threads take at once (a peer's lanes sharing one chunk queue). Waiters
// spin, then yield, and never sleep in the kernel: a std::mutex there had
// io threads sleeping on each other and waking each other (issue 16).
// Not for sections that block.
#pragma once

#include <atomic>
#include <thread>

namespace ferry {

class SpinLock {
 public:
  void lock() {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 128) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        } else {
          std::this_thread::yield();  // the holder may have lost its core
        }
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace ferry
