#include "transfer/io_pool.h"

#include "common/cpu_claim.h"
#include "common/log.h"
#include "common/thread_name.h"

namespace ferry {

void IoPool::Create(int threads, bool shared, std::chrono::microseconds spin) {
  threads_ = std::max(threads, 1);
  spin_ = spin;
  const int n = shared ? 1 : threads_;
  for (int i = 0; i < n; ++i) {
    // A context with one thread needs no locking in its scheduler.
    contexts_.push_back(std::make_unique<asio::io_context>(shared ? threads_ : 1));
    guards_.emplace_back(asio::make_work_guard(*contexts_.back()));
  }
}

IoPool::~IoPool() { Stop(Millis(0)); }

asio::io_context& IoPool::Next() {
  return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()];
}

// A sleeping thread's wake-up costs more than the poll: on the H200
// machine and the 2-core VM alike, tcp moved more bytes with 50 µs of it.
void IoPool::Start(const char* name, std::vector<int> cpus) {
  for (int i = 0; i < threads_; ++i) {
    asio::io_context* io = contexts_[static_cast<size_t>(i) % contexts_.size()].get();
    const int cpu = cpus.empty() ? -1 : cpus[static_cast<size_t>(i) % cpus.size()];
    running_.emplace_back([io, name, spin = spin_] {
      NameThisThread(name);
      if (spin.count() == 0) {
        io->run();
        return;
      }
      // Returns, as run() does, once stopped or out of work.
      while (!io->stopped()) {
        const auto until = Clock::now() + spin;
        size_t ran = 0;
        while ((ran = io->poll()) == 0 && !io->stopped() && Clock::now() < until) {
        }
        if (ran == 0) io->run_one();
      }
    });
    if (cpu >= 0) {  // here, so that it holds once Start returns
      Status st = cpus::PinThread(running_.back().native_handle(), cpu);
      if (!st.ok()) FERRY_LOG_WARN("{} thread left unpinned: {}", name, st.ToString());
    }
  }
}

void IoPool::Stop(Millis drain) {
  for (auto& g : guards_) g.reset();
  Deadline idle = Deadline::After(drain);
  auto all_stopped = [this] {
    for (auto& c : contexts_) {
      if (!c->stopped()) return false;
    }
    return true;
  };
  while (!running_.empty() && !all_stopped() && !idle.Expired()) {
    std::this_thread::sleep_for(Millis(1));
  }
  for (auto& c : contexts_) c->stop();
  for (auto& t : running_) t.join();
  running_.clear();
}

}  // namespace ferry
