// What a client asks of the master and what it grants, in the one form the
// client, the wire service and the master all use.
#pragma once

#include <cstdint>
#include <string>
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
};

// A complete object found, with the read lease the lookup granted.
struct GetGrant {
  ObjectLocation location;
  uint64_t lease_id = 0;  // for ReleaseLease
};

}  // namespace ferry::store
