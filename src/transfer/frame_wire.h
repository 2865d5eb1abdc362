// The frame header of the engine's listener: its own p2p metadata (Hello,
// GetDescriptor) and the frames of transports served on it (tcp's Write and
// Read). 32 bytes, little-endian, written field by field:
//
//   magic u32 | version u8 | opcode u8 | status u8 | flags u8
//   request id u64 | address u64 | length u64
//
// A request frame (Write) is followed by `length` payload bytes; so are the
// Descriptor and ReadData replies when status is OK, and the handshake's
// Hello (0 or kNonceBytes), Challenge and Proof. Frames are answered in
// order on each connection.
//
// Flags are 0 but on Write, Read and ReadData. kFlagCrc32c on a Write or an
// OK ReadData: the payload is followed by its CRC-32C, u32 little-endian
// (common/crc32c.h); on a Read, it asks for such a ReadData. A peer that
// predates the flags closes the connection at the first one it is sent.
//
// With a cluster secret (common/auth.h) every connection opens with the
// handshake, and nothing else is served before it completes:
//   initiator: Hello    address = expected epoch, payload = its nonce
//   target:    Challenge address = its epoch, payload = its nonce, its proof
//   initiator: Proof    payload = its proof
//   target:    HelloAck status OK, PeerRestarted, or Unauthenticated (then it closes)
// Each proof is HMAC-SHA256 over its direction's label, both nonces and both
// epochs (handshake.h); docs/wire-protocol.md has the whole exchange.
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry::wire {

inline constexpr uint32_t kMagic = 0x59524546;  // "FERY"
// 2: the authenticated handshake (a Hello with a payload, Challenge, Proof).
inline constexpr uint8_t kVersion = 2;
inline constexpr size_t kHeaderSize = 32;
// The largest payload one frame may carry; a larger length closes the connection.
inline constexpr uint64_t kMaxPayload = 64ull << 20;

enum class Opcode : uint8_t {
  // address = the epoch the initiator expects (0: any); payload: none, or
  // the initiator's nonce when it holds a secret
  kHello = 1,
  // address = the target's epoch; PeerRestarted on mismatch, Unauthenticated
  // when the target holds a secret the initiator did not prove
  kHelloAck = 2,
  kGetDescriptor = 3,
  kDescriptor = 4,  // payload: EncodeDescriptor
  kWrite = 5,       // payload: the bytes to store at address
  kWriteAck = 6,    // sent once the bytes are applied
  kRead = 7,
  kReadData = 8,   // payload: the bytes read
  kChallenge = 9,  // address = the target's epoch; payload: its nonce, then its proof
  kProof = 10,     // payload: the initiator's proof
};
inline constexpr Opcode kLastOpcode = Opcode::kProof;

inline constexpr uint8_t kFlagCrc32c = 1;
inline constexpr size_t kCrcBytes = 4;  // the trailer kFlagCrc32c adds to a payload

struct Header {
  Opcode opcode = Opcode::kHello;
  StatusCode status = StatusCode::kOk;
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint8_t flags = 0;
};

void EncodeHeader(const Header& h, uint8_t out[kHeaderSize]);
// ProtocolError for a wrong magic, version, opcode or status, an unknown
// flag, or a flag on a frame that takes none.
Result<Header> DecodeHeader(const uint8_t in[kHeaderSize]);

// The trailer of a kFlagCrc32c payload.
void EncodeCrc(uint32_t crc, uint8_t out[kCrcBytes]);
uint32_t DecodeCrc(const uint8_t in[kCrcBytes]);

}  // namespace ferry::wire
