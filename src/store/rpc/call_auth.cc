#include "store/rpc/call_auth.h"

#include <charconv>
#include <cstring>

namespace ferry::store {

namespace {

constexpr std::string_view kLabel = "ferry master call v1";
constexpr uint8_t kNul[1] = {0};

int64_t UnixMs(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

auth::Mac Proof(const auth::Key& key, std::string_view method, int64_t ms,
                std::span<const uint8_t> nonce) {
  const auto t = auth::Le64(static_cast<uint64_t>(ms));
  return key.Sign(kLabel, {auth::AsField(method), kNul, t, nonce});
}

}  // namespace

Result<std::string> MakeCallToken(const auth::Key& key, std::string_view method,
                                  WallClock::time_point now) {
  FERRY_ASSIGN_OR_RETURN(auth::Nonce fresh, auth::NewNonce());
  std::span<const uint8_t> nonce(fresh.data(), 16);
  const int64_t ms = UnixMs(now);
  return "v1." + std::to_string(ms) + "." + auth::Hex(nonce) + "." +
         auth::Hex(Proof(key, method, ms, nonce));
}

size_t CallTokenChecker::NonceHash::operator()(const Nonce& n) const {
  size_t h = 0;
  std::memcpy(&h, n.data(), sizeof(h));  // random bytes: any of them hash well
  return h;
}

Status CallTokenChecker::Check(std::string_view method, const std::string_view* token,
                               WallClock::time_point now) {
  if (token == nullptr) {
    return Status::Unauthenticated(std::string("this master requires the cluster secret (") +
                                   auth::kKeyFileEnv + "): the call carried no token");
  }
  // "v1.<ms>.<nonce>.<mac>"
  std::string_view rest = *token;
  std::string_view part[4];
  for (int i = 0; i < 4; ++i) {
    const size_t dot = i < 3 ? rest.find('.') : rest.size();
    if (dot == std::string_view::npos) return Status::Unauthenticated("malformed call token");
    part[i] = rest.substr(0, dot);
    rest = i < 3 ? rest.substr(dot + 1) : std::string_view();
  }
  int64_t ms = 0;
  const auto [end, ec] = std::from_chars(part[1].data(), part[1].data() + part[1].size(), ms);
  Nonce nonce{};
  auth::Mac mac{};
  if (part[0] != "v1" || ec != std::errc() || end != part[1].data() + part[1].size() ||
      !auth::FromHex(part[2], nonce) || !auth::FromHex(part[3], mac)) {
    return Status::Unauthenticated("malformed call token");
  }
  if (!auth::SameMac(mac, Proof(*key_, method, ms, nonce))) {
    return Status::Unauthenticated(
        "the call token does not verify: another cluster secret, or a token for another call");
  }
  const int64_t skew = UnixMs(now) - ms;
  if (skew > kTokenWindow.count() || skew < -kTokenWindow.count()) {
    return Status::Unauthenticated("the call token was made " + std::to_string(skew) +
                                   " ms from the master's clock (at most " +
                                   std::to_string(kTokenWindow.count()) +
                                   "): an old token replayed, or clocks too far apart");
  }
  std::lock_guard lk(mu_);
  // A token remembered at t is stale by t + 2 x window, by the same clock
  // its freshness is judged on.
  while (!by_time_.empty() && by_time_.front().first + 2 * kTokenWindow < now) {
    seen_.erase(by_time_.front().second);
    by_time_.pop_front();
  }
  if (seen_.count(nonce) != 0) {
    return Status::Unauthenticated("the call token was used before: a replayed call");
  }
  if (seen_.size() >= kMaxRememberedTokens) {
    return Status::ResourceExhausted("too many calls within the token window; retry later");
  }
  seen_.insert(nonce);
  by_time_.emplace_back(now, nonce);
  return Status::Ok();
}

}  // namespace ferry::store
