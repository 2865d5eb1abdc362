// A thread that runs a periodic job, from Start() on: every `period`, or at
// once after Wake(), until the Ticker is destroyed. The destructor waits for a
// run under way, so destroy it before anything the job uses. Start apart from
// construction, so the job may reach the Ticker through its owner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"

namespace ferry {

class Ticker {
 public:
  // `job(woken)`: woken is true when a Wake() asked for this run.
  // `name` names its thread (common/thread_name.h).
  Ticker(const char* name, Millis period, std::function<void(bool woken)> job);
  // Stop()s.
  ~Ticker();
  void Start();
  // Waits for a run under way, and runs the job no more. Owners call it before
  // destroying the Ticker when the job reaches it through them: a unique_ptr
  // being reset is already null while the destructor waits. Not from the job.
  void Stop();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  void Wake();
  // From the next wait on.
  void SetPeriod(Millis period);
  // Runs finished since start. A run that starts after a Wake() has ended
  // once this passes the value read before it by 2.
  uint64_t runs() const { return runs_.load(std::memory_order_acquire); }

 private:
  void Loop();

  const std::string name_;
  const std::function<void(bool)> job_;
  std::mutex mu_;
  std::condition_variable cv_;
  Millis period_;          // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  bool woken_ = false;     // guarded by mu_
  std::atomic<uint64_t> runs_{0};
  std::thread thread_;
};

}  // namespace ferry
