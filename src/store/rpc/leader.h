// Masters of one cluster on etcd: at most one leads, elected through a lease
// and a transaction, and nodes and clients find it there.
//
// One key per cluster, /ferry/<cluster>/master/leader, holds the leader's
// gRPC address and is bound to its lease: it vanishes when the leader dies
// or stops renewing, and the next candidate's transaction creates it again.
// The term of a leadership is that key's create_revision. etcd's revisions
// only grow, so each new leader's term is higher than every earlier one's,
// with no counter to keep; a node or client that has seen a term refuses an
// older one (fencing).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"

namespace ferry {
class Ticker;
namespace coord {
class EtcdClient;
class LeaseKeeper;
}  // namespace coord
}  // namespace ferry

namespace ferry::store {

struct LeaderInfo {
  std::string address;  // "host:port" of the leader's gRPC service
  uint64_t term = 0;    // > 0
};

// The cluster's leader key.
std::string LeaderKey(std::string_view cluster);

// A candidate: campaigns from a thread of its own until destroyed.
class LeaderElection {
 public:
  struct Options {
    std::string address;      // what the leader publishes: its gRPC "host:port"
    int64_t ttl_seconds = 5;  // the lease: a dead leader's key lasts this long
    Millis poll{200};         // how often a standby looks for a vacancy
  };
  // Both run on the election's thread, one at a time, elected before its
  // deposed. Deposed: the lease was lost (etcd unreachable for a whole TTL,
  // or expired, say after the process was paused), the key is no longer
  // ours, or it could not be read to confirm it past the serving time
  // Confirmed allows; the candidate then campaigns again with a new lease.
  // `vacancy`: from the last round that found another leader's key to this
  // election (zero when none was seen): how long the seat was seen empty.
  using ElectedFn = std::function<void(uint64_t term, Millis vacancy)>;
  using DeposedFn = std::function<void(const Status& why)>;

  // InvalidArgument for an empty address or a TTL under 1 s.
  static Result<std::unique_ptr<LeaderElection>> Start(std::shared_ptr<coord::EtcdClient> etcd,
                                                       std::string cluster, Options options,
                                                       ElectedFn elected, DeposedFn deposed);
  // Stops campaigning; a leader resigns (revokes its lease, so its key goes
  // at once and a standby need not wait out the TTL). No callback runs after.
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  bool leading() const { return term_.load() != 0; }
  uint64_t term() const { return term_.load(); }  // 0 unless leading
  // OK while this candidate leads and its lease surely lives (by its last
  // renewal, less a margin): a leader that was paused past its TTL hears
  // Unavailable from its first call on resuming, before its thread has
  // noticed it was deposed. A master serves only while this is OK.
  Status Confirmed() const;

 private:
  LeaderElection(std::shared_ptr<coord::EtcdClient> etcd, std::string cluster, Options options,
                 ElectedFn elected, DeposedFn deposed);
  void Round();
  void Depose(const Status& why);
  void Confirm();

  const std::shared_ptr<coord::EtcdClient> etcd_;
  const std::string key_;
  const Options options_;
  const ElectedFn elected_;
  const DeposedFn deposed_;
  std::atomic<uint64_t> term_{0};
  // The election thread's own:
  std::unique_ptr<coord::LeaseKeeper> keeper_;
  std::atomic<bool> lease_lost_{false};
  std::atomic<Clock::rep> serve_until_{0};       // Confirmed's bound; 0 unless leading
  std::optional<Clock::time_point> other_seen_;  // a round last found another's key
  std::unique_ptr<Ticker> ticker_;
};

// Follows the cluster's leader for nodes and clients: polls its key, and
// says who leads now.
class LeaderResolver {
 public:
  static Result<std::unique_ptr<LeaderResolver>> Start(std::shared_ptr<coord::EtcdClient> etcd,
                                                       std::string cluster,
                                                       Millis poll = Millis(200));
  ~LeaderResolver();
  LeaderResolver(const LeaderResolver&) = delete;
  LeaderResolver& operator=(const LeaderResolver&) = delete;

  // The leader as last read; waits up to `wait` for one when none is known.
  // Unavailable when there is none by then (no leader elected, or etcd
  // unreachable: the message says which).
  Result<LeaderInfo> Leader(Millis wait);
  // Reads the key again at once (after a call to the leader failed).
  void Refresh();

 private:
  LeaderResolver(std::shared_ptr<coord::EtcdClient> etcd, std::string cluster, Millis poll);
  void Poll();

  const std::shared_ptr<coord::EtcdClient> etcd_;
  const std::string key_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<LeaderInfo> leader_;  // guarded by mu_
  Status last_error_;                 // guarded by mu_
  std::unique_ptr<Ticker> ticker_;
};

// The roster: while a node of the cluster lives it holds
// /ferry/<cluster>/nodes/<name> on a lease of its own. A master elected
// later reads it to learn which nodes will mount again; until they have, a
// key it does not know may be on one of them (MasterOptions::awaited_nodes).
std::string RosterPrefix(std::string_view cluster);

// The names on the roster now; entries no node of ours could have written
// (an empty or oversized name) are skipped.
Result<std::vector<std::string>> ReadRoster(coord::EtcdClient& etcd, std::string_view cluster);

// A node's roster entry: put at Start (its error when etcd refuses), kept
// alive from a thread, put again on a new lease when the old one is lost
// (etcd away for a whole TTL); revoked when destroyed, so a node that
// stops is not waited for.
class RosterEntry {
 public:
  static Result<std::unique_ptr<RosterEntry>> Start(std::shared_ptr<coord::EtcdClient> etcd,
                                                    std::string_view cluster,
                                                    const std::string& node,
                                                    int64_t ttl_seconds = 5);
  // The same for the cluster of `url` ("etcd://ENDPOINTS/CLUSTER"), on an
  // etcd client of its own.
  static Result<std::unique_ptr<RosterEntry>> Join(std::string_view url, const std::string& node);
  ~RosterEntry();
  RosterEntry(const RosterEntry&) = delete;
  RosterEntry& operator=(const RosterEntry&) = delete;

 private:
  RosterEntry(std::shared_ptr<coord::EtcdClient> etcd, std::string key, int64_t ttl_seconds);
  Status Put();

  const std::shared_ptr<coord::EtcdClient> etcd_;
  const std::string key_;
  const int64_t ttl_seconds_;
  std::unique_ptr<coord::LeaseKeeper> keeper_;  // the ticker's thread's, once started
  std::unique_ptr<Ticker> ticker_;
};

}  // namespace ferry::store
