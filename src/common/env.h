// Configuration knobs read from the environment. Each knob is declared next to
// its user with its variable name, default and a line of doc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ferry/status.h"

namespace ferry::env {

std::optional<std::string> Get(const char* name);
// The integer value of `name`, or `fallback` when it is unset or empty;
// InvalidArgument, naming the variable and its value, when it is not a number.
Result<int64_t> GetInt(const char* name, int64_t fallback);

}  // namespace ferry::env
