// The cluster secret on the master's gRPC service: every call carries a
// token in its metadata (key kTokenHeader),
//   "v1.<unix ms>.<nonce, 32 hex>.<HMAC-SHA256, 64 hex>"
// whose HMAC covers the method's name, the time and a fresh nonce
// (common/auth.h). The master accepts a token once, for that method, within
// kTokenWindow of its own clock. Per-call tokens rather than TLS: the secret
// is all a deployment has to share (no certificates to issue), and a token
// costs one HMAC per call. Like the engine's handshake it authenticates, and
// does not encrypt; docs/store.md says more.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "common/auth.h"
#include "common/clock.h"
#include "ferry/status.h"

namespace ferry::store {

inline constexpr char kTokenHeader[] = "x-ferry-auth";
// A token is good this long either side of the master's clock: the clocks
// of a cluster's hosts may be this far apart.
inline constexpr Millis kTokenWindow{30000};
// Tokens the master remembers at once (those of the last 2 x kTokenWindow);
// past it, calls are refused with ResourceExhausted until older ones age out.
inline constexpr size_t kMaxRememberedTokens = size_t{1} << 21;

using WallClock = std::chrono::system_clock;

// A token for one call of `method`, made at `now`. Internal if no random
// nonce can be had.
Result<std::string> MakeCallToken(const auth::Key& key, std::string_view method,
                                  WallClock::time_point now = WallClock::now());

// The master's side. Thread safe.
class CallTokenChecker {
 public:
  explicit CallTokenChecker(std::shared_ptr<const auth::Key> key) : key_(std::move(key)) {}

  // OK when `token` (null: the call had none) is a token for `method` made
  // within kTokenWindow of `now` and never seen before, which it then
  // remembers. Unauthenticated saying why otherwise: none, malformed, a
  // proof that does not verify (another secret, or another method's token),
  // too old or too new, or seen before (a replay). ResourceExhausted when
  // kMaxRememberedTokens are held.
  Status Check(std::string_view method, const std::string_view* token,
               WallClock::time_point now = WallClock::now());

 private:
  using Nonce = std::array<uint8_t, 16>;
  struct NonceHash {
    size_t operator()(const Nonce& n) const;
  };

  const std::shared_ptr<const auth::Key> key_;
  std::mutex mu_;
  std::unordered_set<Nonce, NonceHash> seen_;                    // guarded by mu_
  std::deque<std::pair<WallClock::time_point, Nonce>> by_time_;  // guarded by mu_; oldest first
};

}  // namespace ferry::store
