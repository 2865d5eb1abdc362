#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

namespace ferry::log {

spdlog::logger& Get() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    // Not registered with spdlog: an application's own "ferry" logger, or
    // spdlog::drop_all(), cannot collide with it.
    auto l = std::make_shared<spdlog::logger>(
        "ferry", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    const char* lvl = std::getenv("FERRY_LOG_LEVEL");
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
    l->set_pattern("[%H:%M:%S.%e] [ferry %P] [%l] %v");
    return l;
  }();
  return *logger;
}

Status CheckLevelEnv() {
  const char* lvl = std::getenv("FERRY_LOG_LEVEL");
  if (lvl == nullptr || *lvl == '\0' || spdlog::level::from_str(lvl) != spdlog::level::off ||
      std::string_view(lvl) == "off") {
    return Status::Ok();
  }
  return Status::InvalidArgument(std::string("environment variable FERRY_LOG_LEVEL='") + lvl +
                                 "' is not trace, debug, info, warn, error or off");
}

bool RateLimit::Allow(uint64_t* held) {
  std::lock_guard lk(mu_);
  const auto now = Clock::now();
  if (now < next_) {
    ++held_;
    return false;
  }
  next_ = now + period_;
  *held = std::exchange(held_, 0);
  return true;
}

void Refusals::Add(std::string_view peer, std::string_view why) {
  count_.fetch_add(1, std::memory_order_relaxed);
  if (uint64_t held = 0; limit_.Allow(&held)) {
    Get().warn("{}: refusing {}: {}{}", who_, peer, why,
               held == 0 ? "" : fmt::format(" ({} more refused since the last line)", held));
  }
}

}  // namespace ferry::log
