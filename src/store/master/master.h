// The master's metadata and policies, independent of gRPC: objects in sharded
// maps, two-phase puts, read leases, pins, eviction and node liveness.
//
// An object is either being written (invisible to readers) or complete. Space
// is reused only when nobody may still touch it: an object removed or evicted
// while leased, or a put aborted or reclaimed, keeps its space until its lease
// ends or a write grace passes. All clocks are monotonic. Thread safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/ticker.h"
#include "ferry/status.h"
#include "ferry/store.h"
#include "store/master/catalog_log.h"
#include "store/master/space.h"
#include "store/rpc/requests.h"

namespace ferry::store {

struct MasterOptions {
  int shards = 16;
  Millis lease{5000};            // a get's read lease
  Millis put_timeout{10000};     // a begun put not committed by then is reclaimed
  Millis write_grace{1000};      // aborted or reclaimed space waits this long for late writes
  Millis node_ttl{5000};         // a node silent this long, while serving (gate), is unmounted
  Millis tick{100};              // background reclaim, expiry and eviction period
  double high_watermark = 0.90;  // background eviction starts above this fraction used
  double low_watermark = 0.80;   // and stops below this one
  uint64_t max_object_size = 1ull << 32;
  uint32_t max_replicas = 8;
  // The fencing term, sent with every answer (grants, mounts, heartbeats):
  // nodes and clients refuse a master older than one they have seen. 0
  // without elections; `ferry master` picks one from the clock, so a
  // restarted master's is higher. Raised later by Master::SetTerm.
  uint64_t term = 0;
  // Above 0, a commit or a remove returns once every replica's node has
  // applied its catalog change, waiting up to this long for each, and nodes'
  // heartbeats wait for their changes: what was acknowledged survives the
  // master (store/master/catalog_log.h). An elected master turns it on.
  Millis catalog_sync{0};
  // Nodes expected to mount again: an elected master's, read from the roster
  // (store/rpc/leader.h). It knows objects only as their nodes mount, so
  // until each of these has, or node_ttl has passed since it started or
  // last refused a call (gate; a node silent that long is gone), a key it
  // does not know may be on one of
  // them: Get, Exists, Remove and Pin answer Unavailable, not NotFound.
  std::vector<std::string> awaited_nodes;
  // Asked before every call is served, and by the background thread: while
  // it refuses (an elected master whose leadership is unconfirmed, say
  // with etcd away), calls get its answer and nodes can neither heartbeat
  // nor mount. So node_ttl, for expiry and for the awaited nodes, counts
  // from its last refusal: a node is unmounted only once the master has
  // served a whole TTL without hearing from it. Empty: always open.
  std::function<Status()> gate;
};

struct MasterStats {
  SpaceUsage space;
  uint64_t objects = 0;
  uint64_t deferred_bytes = 0;  // freed but fenced by a lease or write grace
  uint64_t puts_begun = 0, puts_committed = 0, puts_aborted = 0, puts_reclaimed = 0;
  uint64_t reserved = 0, reserved_committed = 0;  // reservations made; committed as objects
  uint64_t gets = 0, get_misses = 0, exists = 0, removes = 0;
  uint64_t evicted_objects = 0, evicted_bytes = 0, sync_evictions = 0;
  uint64_t nodes_expired = 0, replicas_dropped = 0;
  uint64_t term = 0;
  // Objects (or replicas of known ones) taken from the catalog of the last
  // node to mount, and from every mount since start.
  uint64_t recovered = 0, recovered_total = 0;
  uint64_t catalog_pending = 0;  // catalog changes the nodes have still to apply
  // Commits and removes that returned before a node applied their change.
  uint64_t catalog_sync_timeouts = 0;
  // Calls refused for not proving the cluster secret; counted by the
  // service (MasterServer), not by Master, which leaves it 0.
  uint64_t auth_failures = 0;
};

class Master {
 public:
  // Key limits checked by every operation: the client API's.
  static constexpr size_t kMaxKeyBytes = Store::kMaxKeyBytes;

  // Starts the background thread (reclaim, node expiry, eviction).
  explicit Master(MasterOptions options);
  ~Master();
  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  const MasterOptions& options() const { return options_; }

  // Node membership. `epoch` is the node process's engine epoch, which every
  // location on it carries. Mount replaces an earlier mount of the same node
  // and drops the replicas it held, then rebuilds objects from the node's
  // catalog (recovery.cc has the rules); the entries it does not take are
  // forgotten through the node's next heartbeats. Returns how many it took.
  // Heartbeat is NotFound for an unknown node, which then mounts again
  // (after a master restart, or once expired); else it returns the catalog
  // changes after `acked` that the node has still to apply.
  Result<MountReply> Mount(const NodeMount& mount);
  Status Mount(const std::string& node, uint64_t epoch, const std::vector<Region>& regions);
  // With `fetch` false it only records `acked`, and returns nothing. With
  // catalog_sync on, and nothing to return, it waits up to `hold` (at most
  // a third of the node TTL) for a change.
  Result<std::vector<CatalogChange>> Heartbeat(const std::string& node, uint64_t acked,
                                               bool fetch = true, Millis hold = Millis(0));
  Status Heartbeat(const std::string& node) { return Heartbeat(node, 0).status(); }
  Status Unmount(const std::string& node);

  // Allocates the replicas of a new object, in state "writing". AlreadyExists
  // if the key is complete, Busy while another put of it is open,
  // ResourceExhausted when it fits nowhere even after evicting everything
  // evictable. `client_node`: preferred when spec.preferred is empty. A
  // replica's extents name its node as their segment.
  // With spec.reserve (and no key): space reserved ahead of a put, which
  // its commit names; it evicts nothing, and is reclaimed like a put when
  // not ended before its timeout.
  Result<PutGrant> PutBegin(const PutSpec& spec, const std::string& client_node);
  // Commits (the object becomes visible) or aborts an open put. NotFound when
  // the put is unknown, expired or was aborted. A reservation's commit
  // (`reserved`) makes it the object `key`: AlreadyExists or Busy, and the
  // reservation ended, when the key is taken or being written.
  Status PutEnd(const std::string& key, uint64_t put_id, bool commit, bool reserved = false);
  // Each in turn, then one catalog wait for them all (catalog_sync).
  std::vector<Status> PutEnd(const std::vector<store::PutEnd>& items);
  // Locations of a complete object, granting a read lease. NotFound otherwise
  // (Unavailable while a miss is unsure: MasterOptions::awaited_nodes, which
  // Exists, Remove and SetPin follow too).
  Result<GetGrant> Get(const std::string& key);
  // Ends a lease before its term, once its reader is done. NotFound when the
  // object or the lease is gone (expired, or the object was removed).
  Status ReleaseLease(const std::string& key, uint64_t lease_id);
  // OK if complete, NotFound otherwise.
  Status Exists(const std::string& key);
  // Busy while leased or being written, unless forced.
  Status Remove(const std::string& key, bool force);
  std::vector<Status> Remove(const std::vector<std::string>& keys, bool force);
  // Removes every object Remove would; returns how many.
  uint64_t RemoveAll(bool force);
  // Sets the pin of a complete object; StorePin::kNone unpins.
  Status SetPin(const std::string& key, StorePin pin, Millis ttl);

  // options().gate's answer (OK without one); a refusal is remembered.
  Status Gate();

  // Background work, also run by the thread every options.tick.
  void Tick();
  // Ends the catalog waits under way and holds no more heartbeats: a server
  // stopping, whose calls must return.
  void Close();
  MasterStats Stats() const;

  // The fencing term (MasterOptions::term). SetTerm raises it, as an
  // election won does; InvalidArgument for a term below the current one.
  uint64_t term() const { return term_.load(); }
  Status SetTerm(uint64_t term);

  // InvalidArgument unless 1 <= key size <= kMaxKeyBytes. Clients check keys
  // with it too, before sending them.
  static Status CheckKey(std::string_view key);

 private:
  struct Object {
    uint64_t size = 0;
    std::vector<Allocation> replicas;
    bool complete = false;
    uint64_t put_id = 0;
    Clock::time_point put_deadline;
    std::vector<std::pair<uint64_t, Clock::time_point>> leases;  // id, end
    Clock::time_point last_access;
    // When the last lease ends; drops the ended ones. Before `now`: unleased.
    Clock::time_point LeaseEnd(Clock::time_point now);
    StorePin pin = StorePin::kNone;
    Clock::time_point pin_until;
    uint64_t term = 0;  // of the master that began the put: with put_id, its name
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, Object> objects;  // guarded by mu
  };
  struct Deferred {
    Allocation allocation;
    Clock::time_point until;
  };
  // A catalog change queued for a node's mount.
  struct Queued {
    std::string node;
    uint64_t generation = 0, seq = 0;
  };

  Shard& ShardOf(const std::string& key);
  // PutEnd and Remove, queuing their catalog changes without waiting.
  Status PutEndOne(const std::string& key, uint64_t put_id, bool commit,
                   std::vector<Queued>* queued);
  Status CommitReserved(const std::string& key, uint64_t put_id, bool commit,
                        std::vector<Queued>* queued);
  Status RemoveOne(const std::string& key, bool force, std::vector<Queued>* queued);
  // Remove, with the shard locked and the object found.
  // The forgets it queues go to `queued` when not null.
  Status RemoveLocked(Shard& shard, std::unordered_map<std::string, Object>::iterator it,
                      bool force, Clock::time_point now, std::vector<Queued>* queued = nullptr);
  // Frees an object's space now or, if it may still be touched, at `until`;
  // each node that lists the object is told to forget it (those changes go
  // to `queued` when not null).
  void FreeLater(const std::string& key, Object& o, Clock::time_point until,
                 std::vector<Queued>* queued = nullptr);
  void FreeLater(std::vector<Allocation> replicas, Clock::time_point until);
  CatalogEntry EntryOf(const std::string& key, const Object& o, const Allocation& a) const;
  // Tells each replica's node to catalog the object (again: a new pin) or,
  // with `forget`, to forget it; the changes go to `queued` when not null.
  void Tell(const std::string& key, const Object& o, bool forget,
            std::vector<Queued>* queued = nullptr);
  // With catalog_sync on, waits until the nodes applied those changes (not
  // holding a shard's lock).
  void AwaitCatalog(const std::vector<Queued>& queued);
  // OK when a key this master does not know is surely stored nowhere;
  // Unavailable while awaited nodes have still to mount (awaited_nodes).
  Status MissIsSure();
  // Mount's second half: the objects of the node's catalog (recovery.cc).
  uint64_t Recover(const std::string& node, uint64_t generation,
                   const std::vector<CatalogEntry>& catalog);
  // One catalog entry; false when it is refused.
  bool RecoverOne(const std::string& node, uint64_t generation, const CatalogEntry& e);
  // Evicts complete, unleased, unpinned objects, least recently used first,
  // until `bytes` are free; with `soft`, soft-pinned ones after the others.
  // Returns the bytes released.
  uint64_t Evict(uint64_t bytes, bool soft);
  void DropNode(const std::string& node, uint64_t generation);
  // Tick's part: unmounts the nodes silent for a TTL of service (membership.cc).
  void ExpireSilentNodes(Clock::time_point now);
  // Ends every reservation (freed after the write grace); their bytes.
  uint64_t DropReservations();

  const MasterOptions options_;
  std::atomic<uint64_t> term_;
  Space space_;
  CatalogLog log_;
  std::atomic<uint64_t> recovered_last_{0};
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint64_t> next_put_id_{1};
  std::atomic<uint64_t> next_lease_id_{1};
  std::atomic<uint64_t> objects_{0};

  // The nodes a miss waits for (options_.awaited_nodes), until rebuilt_by_.
  std::atomic<bool> rebuilding_{false};
  std::mutex awaited_mu_;          // a leaf: taken under a shard's lock
  std::set<std::string> awaited_;  // guarded by awaited_mu_
  const Clock::time_point rebuilt_by_;
  // When Gate last refused (Clock::rep; 0: never): node_ttl runs from then.
  std::atomic<Clock::rep> refused_at_{0};
  // The later of `t` and a node TTL after the last refusal.
  Clock::time_point AfterServedTtl(Clock::time_point t) const;

  // Reservations (PutSpec::reserve), by put id: objects in all but name.
  std::mutex reserved_mu_;
  std::unordered_map<uint64_t, Object> reserved_;  // guarded by reserved_mu_

  mutable std::mutex deferred_mu_;
  std::vector<Deferred> deferred_;  // guarded by deferred_mu_
  uint64_t deferred_bytes_ = 0;     // guarded by deferred_mu_

  mutable std::mutex stats_mu_;
  MasterStats counters_;  // guarded by stats_mu_; space and objects filled on read

  std::atomic<bool> serving_{true};  // the gate's answer at the last tick, for the log
  std::unique_ptr<Ticker> ticker_;   // runs Tick; reset first on destruction
};

}  // namespace ferry::store
