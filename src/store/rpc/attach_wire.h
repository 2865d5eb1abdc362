// The attach protocol: an application and its host's node (`ferry node
// --socket PATH`) over a Unix stream socket. docs/attach-protocol.md states
// every message field by field.
//
// A frame is a 28-byte little-endian header, then `length` payload bytes:
//   magic u32 | version u16 | type u16 | request id u64 | length u32 |
//   deadline_ms u32 | code u8 | 3 zero bytes
// A request carries code 0 and its deadline; the reply repeats its type and id
// and carries the call's status code (and on failure a message as payload).
// A memfd travels as SCM_RIGHTS with the first byte of a Register request,
// and with no other frame.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "ferry/status.h"

namespace ferry::store::attach {

inline constexpr uint32_t kMagic = 0x31544146;  // "FAT1"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 28;
// Largest payload either side accepts: a full batch of the longest keys.
inline constexpr uint32_t kMaxPayload = 16u << 20;
inline constexpr uint32_t kMaxItems = 4096;
inline constexpr size_t kMaxMessage = 4096;  // error texts and names
inline constexpr uint32_t kMaxDeadlineMs = 600000;
// Buffers one value may span (multi-buffer puts and gets).
inline constexpr uint32_t kMaxParts = 256;
// The kinds of a part: a registered (memfd) buffer, or GPU memory shared by
// CUDA IPC.
inline constexpr uint8_t kPartBuffer = 0;
inline constexpr uint8_t kPartGpu = 1;

enum class Type : uint16_t {
  kHello = 1,
  kRegister = 2,
  kUnregister = 3,
  kPut = 4,
  kGet = 5,
  kExists = 6,
  kRemove = 7,
  kPin = 8,
  kLocate = 9,
  kStats = 10,
  kRemoveAll = 11,
  // The client's proof of the cluster secret, answering the node's challenge
  // in the Hello reply; only to a node that holds a secret.
  kAuth = 12,
};
inline constexpr uint16_t kLastType = 12;

struct Frame {
  Type type = Type::kHello;
  uint64_t id = 0;
  uint32_t deadline_ms = 0;
  StatusCode code = StatusCode::kOk;
  std::vector<uint8_t> payload;
  int fd = -1;  // received with the frame; the caller owns it
};

// Sends one frame, with `fd` (if >= 0) attached. The socket is non-blocking;
// Timeout when `deadline` passes, ConnectionLost when the peer is gone.
Status Send(int sock, Type type, uint64_t id, uint32_t deadline_ms, StatusCode code,
            std::span<const uint8_t> payload, Deadline deadline, int fd = -1);
// Receives one frame. Waits up to `first_byte` for it to begin (an idle peer
// is not an error), then up to `rest` for the remainder. ProtocolError for a
// bad magic, version, type, length or code, or for more than one fd. With
// `spin`, it looks for the first byte that long before it sleeps in poll, so
// a reply that comes within it is seen without a thread wake-up.
Result<Frame> Receive(int sock, Deadline first_byte, Millis rest,
                      std::chrono::microseconds spin = {});

// The attach handshake's proofs (common/auth.h): HMAC-SHA256 over the
// direction's label, the client's nonce (from its Hello) and the node's (from
// the Hello reply). Both nonces are fresh, so a recorded proof answers no
// later challenge.
auth::Mac NodeProof(const auth::Key& key, std::string_view client, std::string_view node);
auth::Mac ClientProof(const auth::Key& key, std::string_view client, std::string_view node);

// A status as payload (the message) and back; codes beyond kLastStatusCode
// become ProtocolError.
std::vector<uint8_t> MessagePayload(const Status& st);
Status ReplyStatus(const Frame& reply);

}  // namespace ferry::store::attach
