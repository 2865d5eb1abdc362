// The master's data-path calls over plain TCP: the same service, requests
// and replies as its gRPC API (src/proto/store.proto), without HTTP/2. A
// gRPC call costs about 200 us on loopback where a TCP round trip costs 25
// (docs/performance.md); these calls are on every put and get. Membership
// (Mount, Heartbeat, Unmount) stays on gRPC. docs/master-socket.md states the
// protocol field by field.
//
// Frames are framing.h's. On accept the master sends a greeting (type
// kGreeting): code OK, or Unavailable with a message when it serves too many
// connections, and then closes. A request's type names its method, its
// deadline_ms is the caller's timeout and its payload is
//   token length u16 | token (call_auth.h; empty without a secret) |
//   the method's protobuf request
// One request at a time per connection; the reply has the request's type and
// id, the call's status code, and the protobuf response (OK) or the message.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "store/rpc/framing.h"

namespace ferry::store::master_wire {

inline constexpr uint32_t kMagic = 0x314d4146;  // "FAM1"
inline constexpr uint16_t kVersion = 1;
// gRPC's bound on the master's messages (MasterServer), so that every call
// gRPC would carry fits.
inline constexpr uint32_t kMaxPayload = 64u << 20;
inline constexpr uint32_t kMaxDeadlineMs = 3600000;
inline constexpr size_t kMaxToken = 256;
inline constexpr size_t kMaxMessage = 4096;

enum class Type : uint16_t {
  kGreeting = 1,
  kPutBegin = 2,
  kPutEnd = 3,
  kGet = 4,
  kReleaseLeases = 5,
  kExists = 6,
  kRemove = 7,
  kPin = 8,
  kStats = 9,
  kRemoveAll = 10,
};
inline constexpr uint16_t kLastType = 10;

inline constexpr framing::Format kFormat{"master",  kMagic,      kVersion,
                                         kLastType, kMaxPayload, kMaxDeadlineMs};

// The methods by type, from kPutBegin, as gRPC and call tokens spell them.
inline constexpr std::string_view kMethods[] = {
    "PutBegin", "PutEnd", "Get", "ReleaseLeases", "Exists", "Remove", "Pin", "Stats", "RemoveAll"};
inline constexpr uint16_t kFirstMethod = static_cast<uint16_t>(Type::kPutBegin);
static_assert(kFirstMethod + std::size(kMethods) - 1 == kLastType);

// The method's name ("PutEnd"); null for kGreeting and unknown types.
const char* MethodName(uint16_t type);
// The type of the method named `name`, 0 for one that only gRPC serves
// (Mount, Heartbeat, Unmount, Hello).
constexpr uint16_t TypeFor(std::string_view name) {
  for (uint16_t i = 0; i < std::size(kMethods); ++i) {
    if (kMethods[i] == name) return static_cast<uint16_t>(kFirstMethod + i);
  }
  return 0;
}

// A request's payload. InvalidArgument for a token over kMaxToken.
Result<std::vector<uint8_t>> EncodeRequest(std::string_view token, std::string_view body);
// Its parts, pointing into `payload`. ProtocolError when it is cut short or
// its token is over kMaxToken.
Status DecodeRequest(std::span<const uint8_t> payload, std::string_view* token,
                     std::span<const uint8_t>* body);

// A failed call's message as payload and back (clipped to kMaxMessage).
std::vector<uint8_t> MessagePayload(std::string_view message);
std::string ReplyMessage(std::span<const uint8_t> payload);

}  // namespace ferry::store::master_wire
