// Catalog entries and changes (requests.h) <-> protobuf, shared by the master
// (mounts in, heartbeat changes out) and nodes (the other way).
#pragma once

#include "ferry/status.h"
#include "proto/store.pb.h"
#include "store/rpc/requests.h"

namespace ferry::store {

// Most catalog entries one mount may carry.
inline constexpr int kMaxCatalog = 1 << 20;

void ToProto(const CatalogEntry& e, v1::CatalogEntry* out);
// An entry from the network, checked: a valid key, a known pin, 1 to
// kMaxExtents extents, none empty or wrapping, that sum to the size.
// ProtocolError otherwise.
Result<CatalogEntry> FromProto(const v1::CatalogEntry& in);

}  // namespace ferry::store
