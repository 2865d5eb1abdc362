// Status <-> protobuf ItemStatus, shared by the master and its clients.
#pragma once

#include <grpcpp/support/status.h>

#include "ferry/status.h"
#include "proto/store.pb.h"

namespace ferry::store {

inline void SetStatus(const Status& st, v1::ItemStatus* out) {
  out->set_code(static_cast<uint32_t>(st.code()));
  if (!st.ok()) out->set_message(st.message());
}

// A status from the network: unknown codes become ProtocolError.
inline Status FromProto(const v1::ItemStatus& s) {
  if (s.code() > static_cast<uint32_t>(kLastStatusCode)) {
    return Status::ProtocolError("unknown status code " + std::to_string(s.code()));
  }
  if (s.code() == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(s.code()), s.message());
}

// The gRPC codes a caller acts on, as Ferry's; any other is Internal. The
// master's socket calls send this code for what its service answered.
inline StatusCode CodeFromGrpc(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return StatusCode::kOk;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return StatusCode::kTimeout;
    case grpc::StatusCode::INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case grpc::StatusCode::UNAVAILABLE:
    // Never asked for by the store's calls: the master dropped the call, as
    // one whose leadership has just lapsed does while it stops serving. Like
    // an unreachable master, the caller looks for the leader again
    // (test_cluster_ha's paused leader saw CANCELLED in CI on 2026-12-03).
    case grpc::StatusCode::CANCELLED: return StatusCode::kUnavailable;
    case grpc::StatusCode::UNAUTHENTICATED: return StatusCode::kUnauthenticated;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return StatusCode::kResourceExhausted;
    default: return StatusCode::kInternal;
  }
}

}  // namespace ferry::store
