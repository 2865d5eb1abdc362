// etcd metadata (EngineOptions::metadata "etcd://ENDPOINTS/CLUSTER"): each
// engine publishes its descriptor under /ferry/CLUSTER/engines/<name>, bound
// to a lease it keeps alive, so a dead process's entry goes within the TTL;
// peers read descriptors from there, not from the listener, and a watch on
// the prefix tells them when an entry changes or goes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "coord/etcd_client.h"
#include "coord/etcd_url.h"
#include "coord/etcd_watch.h"
#include "coord/lease_keeper.h"
#include "ferry/status.h"
#include "transfer/descriptor.h"

namespace ferry {

class Ticker;

// The lease's TTL in seconds when the options give none; env FERRY_METADATA_TTL_S.
inline constexpr int64_t kDefaultMetadataTtlSeconds = 10;

class EtcdMetadata {
 public:
  // Parses `url` and checks that etcd answers, each call bounded by
  // `call_timeout` per endpoint. InvalidArgument for a malformed url, a TTL
  // under 1 s or a malformed FERRY_METADATA_TTL_S (which overrides
  // `ttl_seconds`); Unavailable (naming the endpoints) or Timeout when no
  // endpoint answers.
  static Result<std::unique_ptr<EtcdMetadata>> Connect(std::string_view url, Millis call_timeout,
                                                       int64_t ttl_seconds);
  // Stop()s.
  ~EtcdMetadata();
  EtcdMetadata(const EtcdMetadata&) = delete;
  EtcdMetadata& operator=(const EtcdMetadata&) = delete;

  // The key of engine `name`.
  std::string KeyOf(std::string_view name) const;
  int64_t ttl_seconds() const { return ttl_seconds_; }

  // The descriptor engine `name` published. NotFound when there is none
  // (never published, shut down, or its lease expired), ProtocolError for
  // a malformed one; etcd's errors otherwise (EtcdClient).
  Result<SegmentDescriptor> Fetch(std::string_view name);

  // Publishes this engine, `self`, with `describe()` under a new lease kept
  // alive, and starts the watch, which calls `changed(name)` (on its thread)
  // for every change of another engine's entry and `changed("")` when any
  // may have changed unseen. A lost lease, or the entry deleted by someone
  // else, is republished in the background under a new lease. The errors
  // of Connect, when etcd refuses the first publication.
  Status Start(std::string self, std::function<SegmentDescriptor()> describe,
               std::function<void(const std::string&)> changed);
  // Publishes the descriptor again, now (registrations changed); blocks up
  // to the call timeout per endpoint. A failure is logged and retried in the
  // background, so peers see the change late, never a wrong one.
  void Republish();
  // Stops the watch and the background work, deletes the entry and revokes
  // the lease (best effort, bounded by the call timeout). Idempotent.
  void Stop();

 private:
  EtcdMetadata(coord::EtcdUrl url, std::shared_ptr<coord::EtcdClient> client, int64_t ttl);
  // Grants a lease when there is none (or it was lost), then puts the
  // descriptor. Serialized by publish_mu_.
  Status Publish();
  void OnWatch(const coord::WatchUpdate& up);

  const coord::EtcdUrl url_;
  const std::string prefix_;  // /ferry/<cluster>/engines/
  const std::shared_ptr<coord::EtcdClient> client_;
  const int64_t ttl_seconds_;
  std::string self_;
  std::function<SegmentDescriptor()> describe_;
  std::function<void(const std::string&)> changed_;

  std::mutex publish_mu_;
  std::unique_ptr<coord::LeaseKeeper> keeper_;  // guarded by publish_mu_
  bool stopped_ = false;                        // guarded by publish_mu_
  std::atomic<bool> dirty_{false};              // a publication is due
  std::unique_ptr<Ticker> retry_;               // republishes what is due
  std::unique_ptr<coord::EtcdWatch> watch_;
};

}  // namespace ferry
