// Status <-> protobuf ItemStatus, shared by the master and its clients.
#pragma once

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

}  // namespace ferry::store
