#include "common/thread_pool.h"

#include <string>

#include "common/cpu_claim.h"
#include "common/thread_name.h"

namespace ferry {

ThreadPool::ThreadPool(int threads, const char* name) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) {
    threads_.emplace_back([this, name = std::string(name)] {
      NameThisThread(name.c_str());
      Loop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Status ThreadPool::Confine(const std::vector<int>& cpus) {
  for (auto& t : threads_) FERRY_RETURN_IF_ERROR(cpus::ConfineThread(t.native_handle(), cpus));
  return Status::Ok();
}

void ThreadPool::Post(std::function<void()> job) {
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void ThreadPool::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace ferry
