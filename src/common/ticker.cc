#include "common/ticker.h"

#include <utility>

#include "common/thread_name.h"

namespace ferry {

Ticker::Ticker(const char* name, Millis period, std::function<void(bool)> job)
    : name_(name), job_(std::move(job)), period_(period) {}

void Ticker::Start() {
  thread_ = std::thread([this] {
    NameThisThread(name_.c_str());
    Loop();
  });
}

Ticker::~Ticker() { Stop(); }

void Ticker::Stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Ticker::Wake() {
  {
    std::lock_guard lk(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void Ticker::SetPeriod(Millis period) {
  std::lock_guard lk(mu_);
  period_ = period;
}

void Ticker::Loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait_for(lk, period_, [this] { return stopping_ || woken_; });
    if (stopping_) return;
    const bool woken = std::exchange(woken_, false);
    lk.unlock();
    job_(woken);
    runs_.fetch_add(1, std::memory_order_release);
    lk.lock();
  }
}

}  // namespace ferry
