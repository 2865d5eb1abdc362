// A node's catalog: the complete objects whose bytes this node holds (key,
// size, extents, pin, and the put that wrote them), kept from the changes
// the master sends with its heartbeat replies (store/master/catalog_log.h)
// and reported when the node mounts, so that a master that does not know
// the node can rebuild its objects from it. Each entry keeps a CRC-32C of
// its bytes, taken when it is listed and checked before a mount reports it:
// bytes reused since (the object went and the news was lost with the
// master) are never reported as the object. Thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "store/rpc/requests.h"

namespace ferry::store {

class NodeCatalog {
 public:
  // Whether [addr, addr+length) is this node's memory (StoreNode::Owns).
  using Owns = std::function<bool(uint64_t addr, uint64_t length)>;
  explicit NodeCatalog(Owns owns) : owns_(std::move(owns)) {}

  // Applies the changes after acked(), in order; ProtocolError, with
  // nothing applied, when they are not numbered acked()+1, +2, ... An
  // entry outside this node's memory is not listed.
  Status Apply(const std::vector<CatalogChange>& changes);
  // Drops the entries whose bytes no longer match their CRC; how many.
  size_t Verify();
  // A new mount: the master numbers its changes from 1 again.
  void Restart();
  uint64_t acked() const;
  std::vector<CatalogEntry> Entries() const;
  size_t size() const;

 private:
  struct Listed {
    CatalogEntry entry;
    uint32_t crc = 0;
  };
  uint32_t Crc(const CatalogEntry& e) const;

  const Owns owns_;
  mutable std::mutex mu_;
  std::map<std::string, Listed> entries_;  // guarded by mu_
  uint64_t acked_ = 0;                     // guarded by mu_
};

}  // namespace ferry::store
