// A fixed pool of worker threads draining one FIFO of jobs. Used for the copy
// work of the shm and local transports, so Submit never copies on the caller's
// thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/status.h"

namespace ferry {

class ThreadPool {
 public:
  // `name` names its threads (common/thread_name.h).
  ThreadPool(int threads, const char* name);
  // Runs the jobs still queued, then joins.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> job);

  // Keeps every thread of the pool on any of `cpus` (common/cpu_claim.h).
  Status Confine(const std::vector<int>& cpus);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ferry
