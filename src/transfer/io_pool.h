// The engine's network threads. By default each thread runs an io_context of
// its own, and a socket is placed on one of them for its life (Next), so its
// handlers always run on the thread that polls it. With `shared`, every
// thread runs one io_context, as the engine did before: asio then hands each
// completion through one locked queue to whichever thread is free, which on
// the H200 machine held tcp to about half of raw streams (docs/performance.md).
#pragma once

#include <asio.hpp>
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace ferry {

class IoPool {
 public:
  // Empty until Create: the engine lends it to its transports before it
  // knows how many threads they want.
  IoPool() = default;
  ~IoPool();  // Stop(0) if not stopped
  // Makes the contexts, once, before anything else: `threads` (at least 1)
  // each with its own, or all on one when `shared`. A thread with nothing
  // ready polls for up to `spin` before it sleeps. Nothing runs until Start.
  void Create(int threads, bool shared, std::chrono::microseconds spin = {});
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // How many threads Create was given.
  int threads() const { return threads_; }
  // The context a new socket is placed on: round robin. Thread safe.
  asio::io_context& Next();
  // The first context, for what has no socket of its own (an acceptor).
  asio::io_context& first() { return *contexts_.front(); }

  // Starts the threads, each named `name`; thread i is kept on cpus[i % n]
  // when `cpus` is not empty (common/cpu_claim.h).
  void Start(const char* name, std::vector<int> cpus = {});
  // Lets queued handlers (close handlers, say) run until every context is out
  // of work or `drain` passes, then stops and joins the threads.
  void Stop(Millis drain);

 private:
  using Guard = asio::executor_work_guard<asio::io_context::executor_type>;
  int threads_ = 0;
  std::chrono::microseconds spin_{0};
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  std::vector<std::optional<Guard>> guards_;
  std::vector<std::thread> running_;
  std::atomic<size_t> next_{0};
};

}  // namespace ferry
