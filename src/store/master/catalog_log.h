// The changes the master owes each mounted node's catalog (store/rpc/
// requests.h, CatalogChange): queued as objects are committed, re-pinned,
// removed or evicted, and carried by the node's heartbeat replies, so the put
// path pays no round trip for them. A node acknowledges what it applied at
// once; changes reach it in order. In synchronous mode (MasterOptions::
// catalog_sync) a node's heartbeat waits here for its next changes, and a
// commit waits until every replica's node has applied its entry. Thread
// safe; its lock is taken after a shard's, and never held while waiting.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "store/rpc/requests.h"

namespace ferry::store {

class CatalogLog {
 public:
  // At most this many changes go in one heartbeat reply.
  static constexpr size_t kMaxPerReply = 4096;

  // A new mount of `node`: its log starts empty, numbered from 1.
  void Reset(const std::string& node, uint64_t generation);
  // The mount is gone; its changes with it.
  void Drop(const std::string& node, uint64_t generation);
  // Queues a change for the mount; returns its number, 0 when the mount is
  // not this generation (the change is then dropped: nobody will read it).
  uint64_t Add(const std::string& node, uint64_t generation, bool forget, CatalogEntry entry);
  // Forgets what the node applied (up to `acked`) and, with `fetch`, returns
  // what follows, at most kMaxPerReply; when nothing follows, waits up to
  // `hold` for a change. Empty for an unknown node.
  std::vector<CatalogChange> Since(const std::string& node, uint64_t acked, bool fetch = true,
                                   Millis hold = Millis(0));
  // Waits until the mount `generation` of `node` has applied change `seq`,
  // up to `deadline`. True once applied, or when the mount is gone (nobody
  // will apply it); false at the deadline or after Close.
  bool WaitApplied(const std::string& node, uint64_t generation, uint64_t seq,
                   Clock::time_point deadline);
  // Ends every wait, and waits no more: a master stopping.
  void Close();
  // Changes queued for all nodes and not yet applied.
  uint64_t Pending() const;

 private:
  struct Node {
    uint64_t generation = 0;
    uint64_t next = 1;                   // the next change's number
    uint64_t acked = 0;                  // the node applied every change up to this one
    std::vector<CatalogChange> pending;  // after acked, in order
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;         // a change queued or applied, or Close
  std::map<std::string, Node> nodes_;  // guarded by mu_
  bool closed_ = false;                // guarded by mu_
};

}  // namespace ferry::store
