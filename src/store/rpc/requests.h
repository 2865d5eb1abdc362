// What a client asks of the master and what it grants, in the one form the
// client, the wire service and the master all use.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "ferry/store.h"

namespace ferry::store {

// One object to allocate: its key, size and placement.
struct PutSpec {
  std::string key;
  uint64_t size = 0;
  uint32_t replicas = 1;
  std::string preferred;  // node to hold the first replica
  StorePin pin = StorePin::kNone;
  Millis pin_ttl{0};
  // Space reserved ahead of a put, with no key (which must be empty): the
  // PutEnd that commits it names the object. Never evicts to make room.
  bool reserve = false;
};

// A put the master opened: where each replica's bytes go, and how long the
// put may stay open before the master reclaims it.
struct PutGrant {
  uint64_t put_id = 0;
  std::vector<StoreReplica> replicas;
  Millis timeout{0};
};

// The end of an open put: commit makes the object visible, else it aborts.
struct PutEnd {
  std::string key;
  uint64_t put_id = 0;
  bool commit = false;
  bool reserved = false;  // put_id is a reservation (PutSpec::reserve), named `key` at commit
};

// A complete object found, with the read lease the lookup granted.
struct GetGrant {
  ObjectLocation location;
  uint64_t lease_id = 0;  // for ReleaseLease
};

// A complete object whose bytes a node holds, in its catalog: what a master
// that does not know the node rebuilds the object from. (term, put_id) name
// the put that wrote it, the same on every replica.
struct CatalogEntry {
  std::string key;
  uint64_t size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // (addr, length), in value order
  StorePin pin = StorePin::kNone;
  Millis pin_ttl{0};
  uint64_t term = 0;
  uint64_t put_id = 0;
};

// One change the master sends a node for its catalog, numbered from 1 per
// mount: add (or replace) `entry`, or forget its key if its put is entry's.
struct CatalogChange {
  uint64_t seq = 0;
  bool forget = false;
  CatalogEntry entry;
};

// What a node mounts with.
struct NodeMount {
  std::string node;
  uint64_t epoch = 0;                                  // the node's engine epoch, never 0
  std::vector<std::pair<uint64_t, uint64_t>> regions;  // (base, size)
  std::vector<CatalogEntry> catalog;
  bool resumed = false;  // mounted before: old grants may still write its free space
};

// The master's answer to a mount.
struct MountReply {
  Millis node_ttl{0};
  uint64_t term = 0;
  uint64_t recovered = 0;  // catalog entries taken; the rest are forgotten
  // The master holds heartbeats until there are catalog changes, and waits
  // for them to be applied (MasterOptions::catalog_sync): poll without pause.
  bool catalog_sync = false;
};

}  // namespace ferry::store
