// Logging through spdlog, to stderr, on Ferry's own logger: stdout stays the
// application's (`ferry serve` prints JSON there), and so do spdlog's global
// logger and level. Errors are logged once, where they are decided.
// FERRY_LOG_LEVEL (trace|debug|info|warn|error|off) sets the level; default warn.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "ferry/status.h"

namespace ferry::log {

// The logger, made on first use with FERRY_LOG_LEVEL applied.
spdlog::logger& Get();
// InvalidArgument when FERRY_LOG_LEVEL names no level, so that Engine::Create
// refuses it; the logger takes such a value as off.
Status CheckLevelEnv();

// Lets one line through per period, for events a remote peer can repeat at
// will (a flood of failed handshakes must not flood the log). Thread safe.
class RateLimit {
 public:
  explicit RateLimit(Millis period) : period_(period) {}
  // True when a line may be logged now; then *held gets how many were held
  // back since the last one let through.
  bool Allow(uint64_t* held);

 private:
  const Millis period_;
  std::mutex mu_;
  Clock::time_point next_{};  // guarded by mu_
  uint64_t held_ = 0;         // guarded by mu_
};

// Peers refused (say, for not proving the cluster secret): counted, and
// logged as "<who>: refusing <peer>: <why>" at most a line a second.
// Thread safe.
class Refusals {
 public:
  explicit Refusals(std::string who) : who_(std::move(who)) {}
  void Add(std::string_view peer, std::string_view why);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  const std::string who_;
  std::atomic<uint64_t> count_{0};
  RateLimit limit_{Millis(1000)};
};

}  // namespace ferry::log

#define FERRY_LOG_DEBUG(...) ::ferry::log::Get().debug(__VA_ARGS__)
#define FERRY_LOG_INFO(...) ::ferry::log::Get().info(__VA_ARGS__)
#define FERRY_LOG_WARN(...) ::ferry::log::Get().warn(__VA_ARGS__)
#define FERRY_LOG_ERROR(...) ::ferry::log::Get().error(__VA_ARGS__)
