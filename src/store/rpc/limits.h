// Limits of the store's control plane, shared by the master, its clients and
// nodes: what a request may hold, and what a reply may be trusted to hold.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ferry/status.h"
#include "ferry/store.h"

namespace ferry::store {

// Items per master request; clients split longer batches.
inline constexpr int kMaxBatch = 4096;
// Largest number of extents one replica may be split into.
inline constexpr size_t kMaxExtents = 16;
// Regions one node may mount.
inline constexpr size_t kMaxRegions = 64;

// InvalidArgument unless 1 <= key size <= Store::kMaxKeyBytes; every side
// checks keys before using or sending them.
inline Status CheckKey(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > Store::kMaxKeyBytes) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes; the limit is " + std::to_string(Store::kMaxKeyBytes));
  }
  return Status::Ok();
}

}  // namespace ferry::store
