#include "common/env.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace ferry::env {

std::optional<std::string> Get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

Result<int64_t> GetInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v, v + std::strlen(v), out);
  if (ec != std::errc() || *ptr != '\0') {
    return Status::InvalidArgument("environment variable " + std::string(name) + "='" + v +
                                   "' is not an integer");
  }
  return out;
}

int64_t GetIntIn(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  if (!Get(name)) return fallback;  // unset: the fallback may lie outside [lo, hi]
  auto v = GetInt(name, fallback);
  if (v.ok() && v.value() >= lo && v.value() <= hi) return v.value();
  FERRY_LOG_WARN("{}: want {} to {}; using {}", name, lo, hi, fallback);
  return fallback;
}

}  // namespace ferry::env
