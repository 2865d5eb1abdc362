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
// For knobs that exist to compare: the integer value of `name` if it is one
// in [lo, hi], else `fallback`, with a warning naming the variable when it is
// set to something else.
int64_t GetIntIn(const char* name, int64_t lo, int64_t hi, int64_t fallback);

}  // namespace ferry::env
