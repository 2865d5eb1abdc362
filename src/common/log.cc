#include "common/log.h"

#include <cstdlib>
#include <mutex>

namespace ferry::log {

void Init() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* lvl = std::getenv("FERRY_LOG_LEVEL");
    spdlog::set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
    spdlog::set_pattern("[%H:%M:%S.%e] [ferry %P] [%l] %v");
  });
}

}  // namespace ferry::log
