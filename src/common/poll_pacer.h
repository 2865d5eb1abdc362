// The pace of a thread that polls for completions (GPU events, flags the GPU
// writes). Right after progress more completions are likely close, so for
// 200 us it only yields between looks (sleeping there cost 64 MiB GPU-to-GPU
// copies 4% on an H200); after that it sleeps about 20 us per look, which
// bounds its cost.
#pragma once

#include <sys/prctl.h>

#include <chrono>
#include <thread>

#include "common/clock.h"
#include "common/env.h"

namespace ferry {

class PollPacer {
 public:
  static constexpr std::chrono::microseconds kHot{200};
  static constexpr std::chrono::microseconds kIdleSleep{20};

  // Call on the polling thread: the default 50 us timer slack would stretch
  // its short sleeps past what a fast copy takes.
  static void TightenTimerSlack() { prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); }

  // After each look. With work still pending and no progress, yields while
  // hot, else calls sleep(kIdleSleep): a plain sleep, or a wait that new
  // work can cut short.
  // Within kHot of the last progress.
  bool Hot() const { return Clock::now() - last_progress_ < kHot; }

  template <typename Sleep>
  void AfterLook(bool progressed, bool pending, Sleep&& sleep) {
    const auto now = Clock::now();
    if (progressed) last_progress_ = now;
    if (progressed || !pending) return;
    if (now - last_progress_ < kHot) {
      HotPause();
    } else {
      sleep(kIdleSleep);
    }
  }

  // Between two looks while hot. FERRY_POLL_HOT picks how: 0 (default)
  // yields; 1 spins about a microsecond, keeping the core; 2 sleeps about 2
  // us. A yield to a busy thread on the same core can leave the poller off
  // it until the scheduler's next tick, where a sleeper that wakes may take
  // the core back at once.
  static void HotPause() {
    static const int mode = static_cast<int>(env::GetIntIn("FERRY_POLL_HOT", 0, 2, 0));
    if (mode == 1) {
      const auto until = Clock::now() + std::chrono::microseconds(1);
      while (Clock::now() < until) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
    } else if (mode == 2) {
      std::this_thread::sleep_for(std::chrono::microseconds(2));
    } else {
      std::this_thread::yield();
    }
  }

 private:
  Clock::time_point last_progress_ = Clock::now();
};

}  // namespace ferry
