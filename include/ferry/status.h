// Status and Result<T>: Ferry's single error model. No exception crosses the
// public API and nothing in the library exits or aborts; every failure is one
// of these values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ferry {

// Codes are stable: they travel on the wire as one byte.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,  // the caller's input is wrong (zero length, bad name, ...)
  kNotFound = 2,         // unknown segment, region or batch
  kAlreadyExists = 3,    // e.g. an overlapping registration
  kOutOfRange = 4,       // a remote range outside the target's registered memory
  kTimeout = 5,          // a deadline passed
  kCancelled = 6,        // the batch was freed before this request ran
  kConnectionLost = 7,   // the peer closed or died
  kProtocolError = 8,    // a malformed frame
  kNotSupported = 9,     // the operation has no implementation on this path
  kResourceExhausted = 10,
  kUnavailable = 11,    // the peer cannot be reached
  kPeerRestarted = 12,  // the peer's epoch changed; its addresses are void
  kIoError = 13,        // a system call failed
  kInternal = 14,
  kBusy = 15,  // e.g. a store object under a read lease; retry later or force
  // A peer did not prove the cluster secret (FERRY_AUTH_KEY_FILE): it has
  // none, another one, or replayed an old proof.
  kUnauthenticated = 16,
};
// The highest code; wire decoders refuse anything above it.
inline constexpr StatusCode kLastStatusCode = StatusCode::kUnauthenticated;

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // One factory per error code: Status::NotFound("unknown segment 3"). The
  // constructor stays for a code known only at run time (a decoded reply).
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status NotFound(std::string message) {
    return Status(StatusCode::kNotFound, std::move(message));
  }
  static Status AlreadyExists(std::string message) {
    return Status(StatusCode::kAlreadyExists, std::move(message));
  }
  static Status OutOfRange(std::string message) {
    return Status(StatusCode::kOutOfRange, std::move(message));
  }
  static Status Timeout(std::string message) {
    return Status(StatusCode::kTimeout, std::move(message));
  }
  static Status Cancelled(std::string message) {
    return Status(StatusCode::kCancelled, std::move(message));
  }
  static Status ConnectionLost(std::string message) {
    return Status(StatusCode::kConnectionLost, std::move(message));
  }
  static Status ProtocolError(std::string message) {
    return Status(StatusCode::kProtocolError, std::move(message));
  }
  static Status NotSupported(std::string message) {
    return Status(StatusCode::kNotSupported, std::move(message));
  }
  static Status ResourceExhausted(std::string message) {
    return Status(StatusCode::kResourceExhausted, std::move(message));
  }
  static Status Unavailable(std::string message) {
    return Status(StatusCode::kUnavailable, std::move(message));
  }
  static Status PeerRestarted(std::string message) {
    return Status(StatusCode::kPeerRestarted, std::move(message));
  }
  static Status IoError(std::string message) {
    return Status(StatusCode::kIoError, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }
  static Status Busy(std::string message) { return Status(StatusCode::kBusy, std::move(message)); }
  static Status Unauthenticated(std::string message) {
    return Status(StatusCode::kUnauthenticated, std::move(message));
  }
  // Translates errno `err` where a system call failed; `what` names the call.
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OutOfRange: remote range [...] is not registered".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status. Accessing value() of an error is a bug.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ferry

#define FERRY_CONCAT_INNER(a, b) a##b
#define FERRY_CONCAT(a, b) FERRY_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define FERRY_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::ferry::Status _ferry_st = (expr);    \
    if (!_ferry_st.ok()) return _ferry_st; \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL(FERRY_CONCAT(_ferry_res_, __LINE__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
