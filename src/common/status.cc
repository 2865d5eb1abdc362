#include "ferry/status.h"

#include <cstring>

namespace ferry {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kConnectionLost: return "ConnectionLost";
    case StatusCode::kProtocolError: return "ProtocolError";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kPeerRestarted: return "PeerRestarted";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kBusy: return "Busy";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
  }
  return "Unknown";
}

Status Status::FromErrno(int err, std::string_view what) {
  char buf[128];
  // GNU strerror_r returns the message pointer, which may not be `buf`.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return Status::IoError(std::string(what) + ": " + msg);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  if (!message_.empty()) s += ": " + message_;
  return s;
}

}  // namespace ferry
