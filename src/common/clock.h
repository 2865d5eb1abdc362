// Monotonic time and deadlines. Every wait in Ferry is bounded by one of these.
#pragma once

#include <chrono>

namespace ferry {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

class Deadline {
 public:
  Deadline() : at_(Clock::time_point::max()) {}
  explicit Deadline(Clock::time_point at) : at_(at) {}
  static Deadline After(Clock::duration d) { return Deadline(Clock::now() + d); }

  Clock::time_point at() const { return at_; }
  bool Expired() const { return Clock::now() >= at_; }
  Clock::duration Remaining() const {
    auto now = Clock::now();
    return now >= at_ ? Clock::duration::zero() : at_ - now;
  }

 private:
  Clock::time_point at_;
};

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace ferry
