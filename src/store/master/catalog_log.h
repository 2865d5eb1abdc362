// The changes the master owes each mounted node's catalog (store/rpc/
// requests.h, CatalogChange): queued as objects are committed, re-pinned,
// removed or evicted, and carried by the node's heartbeat replies, so the put
// path pays no round trip for them. A node acknowledges what it applied at
// once; changes reach it in order. Thread safe; its lock is taken after a
// shard's.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

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
  // what follows, at most kMaxPerReply. Empty for an unknown node.
  std::vector<CatalogChange> Since(const std::string& node, uint64_t acked, bool fetch = true);
  // Changes queued for all nodes and not yet applied.
  uint64_t Pending() const;

 private:
  struct Node {
    uint64_t generation = 0;
    uint64_t next = 1;   // the next change's number
    uint64_t acked = 0;  // the node applied every change up to this one
    std::vector<CatalogChange> pending;  // after acked, in order
  };
  mutable std::mutex mu_;
  std::map<std::string, Node> nodes_;  // guarded by mu_
};

}  // namespace ferry::store
