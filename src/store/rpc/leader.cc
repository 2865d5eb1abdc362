#include "store/rpc/leader.h"

#include "common/log.h"
#include "common/ticker.h"
#include "coord/etcd_client.h"
#include "coord/etcd_url.h"
#include "coord/lease_keeper.h"

namespace ferry::store {
namespace {

constexpr size_t kMaxAddressBytes = 256;

// A leader key's state as a LeaderInfo; ProtocolError for one no candidate
// of ours could have written.
Result<LeaderInfo> Decode(const coord::KeyValue& kv) {
  if (kv.value.empty() || kv.value.size() > kMaxAddressBytes || kv.create_revision <= 0) {
    return Status::ProtocolError("etcd: malformed leader entry under " + kv.key);
  }
  return LeaderInfo{kv.value, static_cast<uint64_t>(kv.create_revision)};
}

// Stops `keeper` and revokes its lease, so that the keys bound to it go at
// once. OK also when there was none, or etcd no longer had it; else the
// keys last their TTL.
Status EndLease(coord::EtcdClient& etcd, std::unique_ptr<coord::LeaseKeeper>& keeper) {
  if (keeper == nullptr) return Status::Ok();
  const coord::LeaseId id = keeper->id();
  keeper.reset();
  Status st = etcd.LeaseRevoke(id);
  return st.code() == StatusCode::kNotFound ? Status::Ok() : st;
}

}  // namespace

std::string LeaderKey(std::string_view cluster) {
  return "/ferry/" + std::string(cluster) + "/master/leader";
}

// ---- LeaderElection ----

Result<std::unique_ptr<LeaderElection>> LeaderElection::Start(
    std::shared_ptr<coord::EtcdClient> etcd, std::string cluster, Options options,
    ElectedFn elected, DeposedFn deposed) {
  if (options.address.empty() || options.address.size() > kMaxAddressBytes) {
    return Status::InvalidArgument("a master candidate needs its address (1 to 256 bytes)");
  }
  if (options.ttl_seconds < 1)
    return Status::InvalidArgument("the leader lease TTL must be >= 1 s");
  std::unique_ptr<LeaderElection> e(new LeaderElection(std::move(etcd), std::move(cluster),
                                                       std::move(options), std::move(elected),
                                                       std::move(deposed)));
  e->ticker_->Start();
  return e;
}

LeaderElection::LeaderElection(std::shared_ptr<coord::EtcdClient> etcd, std::string cluster,
                               Options options, ElectedFn elected, DeposedFn deposed)
    : etcd_(std::move(etcd)),
      key_(LeaderKey(cluster)),
      options_(std::move(options)),
      elected_(std::move(elected)),
      deposed_(std::move(deposed)),
      ticker_(
          std::make_unique<Ticker>("ferry-election", options_.poll, [this](bool) { Round(); })) {}

LeaderElection::~LeaderElection() {
  ticker_->Stop();
  // Resigning: the key goes with the lease, so a standby takes over at once.
  if (Status st = EndLease(*etcd_, keeper_); !st.ok()) {
    FERRY_LOG_WARN("election: could not resign ({}); the key lasts its TTL", st.ToString());
  }
}

Status LeaderElection::Confirmed() const {
  if (!leading()) return Status::Unavailable("this master does not lead " + key_);
  const Clock::time_point until(Clock::duration(serve_until_.load()));
  if (Clock::now() >= until) {
    return Status::Unavailable("this master's leadership of " + key_ +
                               " is not confirmed (its lease may have run out)");
  }
  return Status::Ok();
}

// The leader serves until its lease's sure end, less a tenth of the TTL and
// a poll, for the gap between etcd's clock and ours and the next round.
void LeaderElection::Confirm() {
  const auto margin = std::chrono::duration_cast<Clock::duration>(
      std::chrono::milliseconds(options_.ttl_seconds * 100) + options_.poll);
  serve_until_ = (keeper_->alive_until() - margin).time_since_epoch().count();
}

void LeaderElection::Depose(const Status& why) {
  serve_until_ = 0;
  const bool was = term_.exchange(0) != 0;
  if (was) {
    FERRY_LOG_WARN("election: no longer leading {}: {}", key_, why.ToString());
    if (deposed_) deposed_(why);
  }
}

// One step: hold a fresh lease, then try to take the key, or check that it
// is still ours.
void LeaderElection::Round() {
  if (keeper_ != nullptr && lease_lost_.load()) {
    keeper_.reset();
    Depose(Status::Unavailable("the leader lease was lost"));
  }
  if (keeper_ == nullptr) {
    auto lease = etcd_->LeaseGrant(options_.ttl_seconds);
    if (!lease.ok()) return;  // etcd unreachable: try again next round
    lease_lost_ = false;
    keeper_ = std::make_unique<coord::LeaseKeeper>(etcd_, lease.value(),
                                                   [this](const Status&) { lease_lost_ = true; });
  }
  const coord::LeaseId lease = keeper_->id();
  if (leading()) {
    auto kv = etcd_->Get(key_);
    if (!kv.ok()) {
      // Unconfirmed past its serving time while its lease may still be
      // renewed: it serves nothing, and holding the key would keep a
      // standby that reaches etcd from taking over. It stands down; the
      // key goes with the lease, now if the revoke gets through, else at
      // its TTL, as the keeper stops renewing it.
      if (Confirmed().ok()) return;
      keeper_.reset();
      (void)etcd_->LeaseRevoke(lease);
      Depose(Status::Unavailable("the leader key could not be read: " + kv.status().ToString()));
      return;
    }
    if (!kv.value() || kv.value()->lease != lease) {
      // Deleted by hand, or taken over: our lease is of no use for the key now.
      keeper_.reset();
      (void)etcd_->LeaseRevoke(lease);
      Depose(Status::Unavailable("the leader key is no longer this candidate's"));
      return;
    }
    Confirm();
    return;
  }
  auto txn = etcd_->Txn({coord::Compare::Absent(key_)},
                        {coord::TxnOp::Put(key_, options_.address, lease), coord::TxnOp::Get(key_)},
                        {coord::TxnOp::Get(key_)});
  if (!txn.ok()) return;
  const auto& reads = txn.value().reads;
  if (reads.empty() || reads.back().kvs.size() != 1) return;  // deleted between: next round
  const coord::KeyValue& kv = reads.back().kvs.front();
  if (kv.lease != lease) {  // someone else leads
    other_seen_ = Clock::now();
    return;
  }
  auto info = Decode(kv);
  if (!info.ok()) return;
  Confirm();
  term_ = info.value().term;
  FERRY_LOG_INFO("election: leading {} as {} in term {}", key_, options_.address,
                 info.value().term);
  const Millis vacancy =
      other_seen_ ? std::chrono::duration_cast<Millis>(Clock::now() - *other_seen_) : Millis(0);
  other_seen_.reset();
  if (elected_) elected_(info.value().term, vacancy);
}

// ---- LeaderResolver ----

Result<std::unique_ptr<LeaderResolver>> LeaderResolver::Start(
    std::shared_ptr<coord::EtcdClient> etcd, std::string cluster, Millis poll) {
  std::unique_ptr<LeaderResolver> r(new LeaderResolver(std::move(etcd), std::move(cluster), poll));
  r->ticker_->Start();
  return r;
}

LeaderResolver::LeaderResolver(std::shared_ptr<coord::EtcdClient> etcd, std::string cluster,
                               Millis poll)
    : etcd_(std::move(etcd)),
      key_(LeaderKey(cluster)),
      last_error_(Status::Unavailable("no leader read yet")),
      ticker_(std::make_unique<Ticker>("ferry-leader", poll, [this](bool) { Poll(); })) {}

LeaderResolver::~LeaderResolver() { ticker_->Stop(); }

void LeaderResolver::Poll() {
  auto kv = etcd_->Get(key_);
  std::lock_guard lk(mu_);
  if (!kv.ok()) {
    // Keep the last leader: etcd being away does not make it go.
    last_error_ = kv.status();
    return;
  }
  if (!kv.value()) {
    leader_.reset();
    last_error_ = Status::Unavailable("no master leads " + key_ + " now");
    return;
  }
  auto info = Decode(*kv.value());
  if (!info.ok()) {
    leader_.reset();
    last_error_ = info.status();
    return;
  }
  // Terms never go back: a stale read (another endpoint behind) is ignored.
  if (!leader_ || info.value().term >= leader_->term) leader_ = info.value();
  cv_.notify_all();
}

Result<LeaderInfo> LeaderResolver::Leader(Millis wait) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, wait, [this] { return leader_.has_value(); })) {
    return Status::Unavailable("no master leader: " + last_error_.ToString());
  }
  return *leader_;
}

void LeaderResolver::Refresh() { ticker_->Wake(); }

// ---- The roster ----

std::string RosterPrefix(std::string_view cluster) {
  return "/ferry/" + std::string(cluster) + "/nodes/";
}

Result<std::vector<std::string>> ReadRoster(coord::EtcdClient& etcd, std::string_view cluster) {
  const std::string prefix = RosterPrefix(cluster);
  FERRY_ASSIGN_OR_RETURN(coord::RangeResult range, etcd.GetPrefix(prefix));
  std::vector<std::string> names;
  for (const coord::KeyValue& kv : range.kvs) {
    if (kv.key.size() <= prefix.size() || kv.key.size() - prefix.size() > kMaxAddressBytes)
      continue;
    names.push_back(kv.key.substr(prefix.size()));
  }
  return names;
}

Result<std::unique_ptr<RosterEntry>> RosterEntry::Start(std::shared_ptr<coord::EtcdClient> etcd,
                                                        std::string_view cluster,
                                                        const std::string& node,
                                                        int64_t ttl_seconds) {
  if (node.empty() || node.size() > kMaxAddressBytes) {
    return Status::InvalidArgument("a roster entry needs the node's name (1 to 256 bytes)");
  }
  if (ttl_seconds < 1) return Status::InvalidArgument("the roster lease TTL must be >= 1 s");
  std::unique_ptr<RosterEntry> e(
      new RosterEntry(std::move(etcd), RosterPrefix(cluster) + node, ttl_seconds));
  FERRY_RETURN_IF_ERROR(e->Put());
  e->ticker_->Start();
  return e;
}

Result<std::unique_ptr<RosterEntry>> RosterEntry::Join(std::string_view url,
                                                       const std::string& node) {
  FERRY_ASSIGN_OR_RETURN(coord::EtcdUrl u, coord::ParseEtcdUrl(url));
  FERRY_ASSIGN_OR_RETURN(auto etcd, coord::EtcdClient::Create({u.endpoints}));
  return Start(std::move(etcd), u.cluster, node);
}

RosterEntry::RosterEntry(std::shared_ptr<coord::EtcdClient> etcd, std::string key,
                         int64_t ttl_seconds)
    : etcd_(std::move(etcd)),
      key_(std::move(key)),
      ttl_seconds_(ttl_seconds),
      // The keeper renews; this only looks for a lost lease, a few times a TTL.
      ticker_(
          std::make_unique<Ticker>("ferry-roster", Millis(ttl_seconds * 1000 / 4), [this](bool) {
            if (keeper_ != nullptr && !keeper_->lost()) return;
            keeper_.reset();
            Status st = Put();
            if (!st.ok()) FERRY_LOG_DEBUG("roster: {} not put again yet: {}", key_, st.ToString());
          })) {}

RosterEntry::~RosterEntry() {
  ticker_->Stop();
  if (Status st = EndLease(*etcd_, keeper_); !st.ok()) {
    FERRY_LOG_WARN("roster: could not remove {} ({}); it lasts its TTL", key_, st.ToString());
  }
}

Status RosterEntry::Put() {
  FERRY_ASSIGN_OR_RETURN(coord::Lease lease, etcd_->LeaseGrant(ttl_seconds_));
  auto put = etcd_->Put(key_, "", lease.id);
  if (!put.ok()) {
    (void)etcd_->LeaseRevoke(lease.id);
    return put.status();
  }
  keeper_ = std::make_unique<coord::LeaseKeeper>(etcd_, lease, nullptr);
  return Status::Ok();
}

}  // namespace ferry::store
