// Logging through spdlog. Errors are logged once, where they are decided.
// FERRY_LOG_LEVEL (trace|debug|info|warn|error|off) sets the level; default warn.
#pragma once

#include <spdlog/spdlog.h>

namespace ferry::log {

// Applies FERRY_LOG_LEVEL once per process; cheap to call repeatedly.
void Init();

}  // namespace ferry::log

#define FERRY_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define FERRY_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define FERRY_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define FERRY_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
