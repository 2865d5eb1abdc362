#include "coord/lease_keeper.h"

#include <algorithm>

#include "common/log.h"
#include "common/ticker.h"

namespace ferry::coord {
namespace {
constexpr Millis kRetryPeriod{100};
}

LeaseKeeper::LeaseKeeper(std::shared_ptr<EtcdClient> client, Lease lease, LostFn on_lost)
    : client_(std::move(client)),
      lease_(lease),
      on_lost_(std::move(on_lost)),
      renewed_(Clock::now()) {
  alive_until_ = (renewed_ + std::chrono::seconds(lease_.ttl_seconds)).time_since_epoch().count();
  const Millis period = std::max(kRetryPeriod, Millis(lease_.ttl_seconds * 1000 / 3));
  ticker_ = std::make_unique<Ticker>("ferry-lease", period, [this, period](bool) {
    if (lost()) return;
    Renew();
    ticker_->SetPeriod(lost() ? Millis(3600 * 1000) : period);
  });
  ticker_->Start();
}

LeaseKeeper::~LeaseKeeper() { ticker_->Stop(); }

void LeaseKeeper::Renew() {
  const Clock::time_point asked = Clock::now();
  auto ttl = client_->LeaseKeepAliveOnce(lease_.id);
  if (ttl.ok()) {
    renewed_ = asked;  // the new TTL runs from no later than this
    alive_until_.store((asked + std::chrono::seconds(ttl.value())).time_since_epoch().count(),
                       std::memory_order_release);
    return;
  }
  Status st = ttl.status();
  const bool gone = st.code() == StatusCode::kNotFound;
  if (!gone && Clock::now() - renewed_ < std::chrono::seconds(lease_.ttl_seconds)) {
    FERRY_LOG_DEBUG("etcd lease {:x}: renewal failed, retrying: {}", lease_.id, st.ToString());
    ticker_->SetPeriod(kRetryPeriod);
    return;
  }
  if (!gone) {
    st = Status(st.code(), "etcd lease " + std::to_string(lease_.id) +
                               " not renewed for its whole TTL: " + st.message());
  }
  lost_.store(true, std::memory_order_release);
  FERRY_LOG_WARN("etcd lease {:x} lost: {}", lease_.id, st.ToString());
  if (on_lost_) on_lost_(st);
}

}  // namespace ferry::coord
