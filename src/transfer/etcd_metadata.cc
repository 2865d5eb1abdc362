#include "transfer/etcd_metadata.h"

#include "common/env.h"
#include "common/log.h"
#include "common/ticker.h"

namespace ferry {
namespace {
// How often the background looks for a publication that is due, when
// nothing wakes it; a lost lease wakes it at once.
constexpr Millis kRetryPeriod{500};
}  // namespace

Result<std::unique_ptr<EtcdMetadata>> EtcdMetadata::Connect(std::string_view url,
                                                            Millis call_timeout,
                                                            int64_t ttl_seconds) {
  FERRY_ASSIGN_OR_RETURN(coord::EtcdUrl parsed, coord::ParseEtcdUrl(url));
  FERRY_ASSIGN_OR_RETURN(int64_t ttl, env::GetInt("FERRY_METADATA_TTL_S", ttl_seconds));
  if (ttl < 1 || ttl > 3600) {
    return Status::InvalidArgument(
        "the metadata TTL (FERRY_METADATA_TTL_S) must be 1..3600 s, not " + std::to_string(ttl));
  }
  coord::EtcdOptions o;
  o.endpoints = parsed.endpoints;
  o.call_timeout = call_timeout;
  FERRY_ASSIGN_OR_RETURN(auto client, coord::EtcdClient::Create(std::move(o)));
  std::unique_ptr<EtcdMetadata> m(new EtcdMetadata(std::move(parsed), std::move(client), ttl));
  // Fails now, with etcd's reason, rather than at the first publication.
  auto probe = m->client_->GetPrefix(m->prefix_ + "\x01");
  if (!probe.ok()) {
    return Status(probe.status().code(),
                  "metadata " + std::string(url) + ": " + probe.status().message());
  }
  return m;
}

EtcdMetadata::EtcdMetadata(coord::EtcdUrl url, std::shared_ptr<coord::EtcdClient> client,
                           int64_t ttl)
    : url_(std::move(url)),
      prefix_("/ferry/" + url_.cluster + "/engines/"),
      client_(std::move(client)),
      ttl_seconds_(ttl) {}

EtcdMetadata::~EtcdMetadata() { Stop(); }

std::string EtcdMetadata::KeyOf(std::string_view name) const { return prefix_ + std::string(name); }

Result<SegmentDescriptor> EtcdMetadata::Fetch(std::string_view name) {
  FERRY_ASSIGN_OR_RETURN(std::optional<coord::KeyValue> kv, client_->Get(KeyOf(name)));
  if (!kv) {
    return Status::NotFound("no engine '" + std::string(name) + "' in etcd cluster " +
                            url_.cluster + " (never started, shut down, or its lease expired)");
  }
  auto d = DecodeDescriptor(reinterpret_cast<const uint8_t*>(kv->value.data()), kv->value.size());
  if (!d.ok()) {
    return Status::ProtocolError("etcd entry " + kv->key + ": " + d.status().message());
  }
  return d;
}

Status EtcdMetadata::Start(std::string self, std::function<SegmentDescriptor()> describe,
                           std::function<void(const std::string&)> changed) {
  self_ = std::move(self);
  describe_ = std::move(describe);
  changed_ = std::move(changed);
  // Made first, since the lease keeper wakes it; started once published.
  retry_ = std::make_unique<Ticker>("ferry-etcd", kRetryPeriod, [this](bool) {
    if (!dirty_.load()) return;
    Status st = Publish();
    if (!st.ok()) FERRY_LOG_DEBUG("etcd metadata: republishing {}: {}", self_, st.ToString());
  });
  FERRY_RETURN_IF_ERROR(Publish());
  FERRY_ASSIGN_OR_RETURN(
      watch_, coord::EtcdWatch::Start(client_, prefix_, true, 0,
                                      [this](const coord::WatchUpdate& up) { OnWatch(up); }));
  retry_->Start();
  return Status::Ok();
}

Status EtcdMetadata::Publish() {
  std::lock_guard lk(publish_mu_);
  if (stopped_) return Status::Cancelled("stopped");
  dirty_.store(false);
  auto fail = [&](Status st) {
    dirty_.store(true);  // the background tries again
    return st;
  };
  if (keeper_ == nullptr || keeper_->lost()) {
    keeper_.reset();
    auto lease = client_->LeaseGrant(ttl_seconds_);
    if (!lease.ok()) return fail(lease.status());
    keeper_ = std::make_unique<coord::LeaseKeeper>(client_, lease.value(), [this](const Status&) {
      dirty_.store(true);
      retry_->Wake();
    });
  }
  std::vector<uint8_t> bytes = EncodeDescriptor(describe_());
  auto put = client_->Put(
      KeyOf(self_), std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
      keeper_->id());
  if (put.status().code() == StatusCode::kNotFound) keeper_.reset();  // the lease went meanwhile
  if (!put.ok()) return fail(put.status());
  return Status::Ok();
}

void EtcdMetadata::Republish() {
  Status st = Publish();
  if (!st.ok() && st.code() != StatusCode::kCancelled) {
    FERRY_LOG_WARN("etcd metadata: publishing {} failed, retrying in the background: {}", self_,
                   st.ToString());
  }
}

void EtcdMetadata::OnWatch(const coord::WatchUpdate& up) {
  if (up.resync) {
    changed_("");
    dirty_.store(true);  // our own entry may have gone unseen too
    return;
  }
  for (const auto& e : up.events) {
    std::string name = e.kv.key.substr(prefix_.size());
    if (name == self_) {
      // Ours, deleted by someone else or by a lease we lost: put it back.
      if (e.type == coord::WatchEvent::Type::kDelete) {
        dirty_.store(true);
        retry_->Wake();
      }
      continue;
    }
    changed_(name);
  }
}

void EtcdMetadata::Stop() {
  watch_.reset();
  if (retry_) retry_->Stop();
  std::unique_ptr<coord::LeaseKeeper> keeper;
  {
    std::lock_guard lk(publish_mu_);
    if (stopped_) return;
    stopped_ = true;
    keeper = std::move(keeper_);
  }
  if (keeper == nullptr || self_.empty()) return;
  const coord::LeaseId id = keeper->id();
  keeper.reset();
  // Revoking deletes the entry too; the delete first, so a revoke that fails
  // still leaves no entry behind.
  auto del = client_->Delete(KeyOf(self_));
  Status rev = client_->LeaseRevoke(id);
  if (!del.ok() || (!rev.ok() && rev.code() != StatusCode::kNotFound)) {
    FERRY_LOG_WARN("etcd metadata: withdrawing {}: {} / {}; it goes when its lease expires", self_,
                   del.status().ToString(), rev.ToString());
  }
}

}  // namespace ferry
