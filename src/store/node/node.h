// A store node: contributes memfd-backed memory of an engine to the store. It
// mounts the memory at the master, heartbeats, and mounts again whenever the
// master no longer knows it (a master restart, or after missing its TTL),
// reporting the catalog of the objects it holds (catalog.h) so that a
// restarted master gets them back. The catalog follows the changes that
// come with the heartbeat replies.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "common/ticker.h"
#include "ferry/engine.h"
#include "store/node/catalog.h"
#include "store/rpc/master_client.h"

namespace ferry::store {

class RosterEntry;

struct NodeOptions {
  // "host:port", or "etcd://ENDPOINTS/CLUSTER": the cluster's leader, and
  // the node goes on its roster (store/rpc/leader.h).
  std::string master;
  uint64_t segment_size = 64ull << 20;  // bytes per region
  int segments = 1;                     // regions, each one AllocateMemory buffer
  Millis heartbeat{1000};               // period; also capped at a third of the master's TTL
  Millis rpc_timeout{2000};
  std::shared_ptr<const auth::Key> key = nullptr;  // proven to the master on each call; null: none
};

class StoreNode {
 public:
  // Allocates the regions from `engine` (which must outlive the node) and
  // starts the session with the master. With wait_for_mount, fails unless the
  // first mount succeeds; otherwise keeps trying in the background, unless
  // the master refuses the node's secret (Unauthenticated): a configuration
  // error, not a master that is away.
  static Result<std::unique_ptr<StoreNode>> Start(Engine& engine, const NodeOptions& options,
                                                  bool wait_for_mount);
  // Stops heartbeats, unmounts (bounded by rpc_timeout) and frees the memory.
  ~StoreNode();

  const std::string& name() const { return engine_.name(); }
  bool mounted() const { return mounted_.load(); }
  // Complete objects whose bytes this node holds, as far as it knows.
  size_t cataloged() const { return catalog_.size(); }
  // Whether [addr, addr+length) lies inside this node's memory: what the
  // master names there may be copied in this process directly.
  bool Owns(uint64_t addr, uint64_t length) const;

 private:
  StoreNode(Engine& engine, NodeOptions options, std::unique_ptr<MasterClient> client);
  Status MountOnce();
  void Tick();

  Engine& engine_;
  const NodeOptions options_;
  std::unique_ptr<MasterClient> client_;
  std::vector<std::pair<uint64_t, uint64_t>> regions_;
  std::atomic<bool> mounted_{false};
  bool mounted_before_ = false;  // by Tick's thread (and Start's, before it runs)
  // The master holds heartbeats for catalog changes (MountReply::
  // catalog_sync): poll again at once; by Tick's thread, as is period_.
  bool catalog_sync_ = false;
  Millis period_{0};
  NodeCatalog catalog_;
  // On the cluster's roster while it lives (an etcd:// master): a master
  // elected later waits for this node before it trusts a miss.
  std::unique_ptr<RosterEntry> roster_;

  // Runs Tick from Start on; stopped first on destruction.
  std::unique_ptr<Ticker> ticker_;
};

}  // namespace ferry::store
