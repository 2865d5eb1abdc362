// What a client asks of the master, in the one form the client, the wire
// service and the master all use.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace ferry::store
