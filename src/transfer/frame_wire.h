// The frame header of the engine's listener: its own p2p metadata (Hello,
// GetDescriptor) and the frames of transports served on it (tcp's Write and
// Read). 32 bytes, little-endian, written field by field:
//
//   magic u32 | version u8 | opcode u8 | status u8 | reserved u8 (0)
//   request id u64 | address u64 | length u64
//
// A request frame (Write) is followed by `length` payload bytes; so are the
// Descriptor and ReadData replies when status is OK. Frames are answered in
// order on each connection.
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry::wire {

inline constexpr uint32_t kMagic = 0x59524546;  // "FERY"
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 32;
// The largest payload one frame may carry; a larger length closes the connection.
inline constexpr uint64_t kMaxPayload = 64ull << 20;

enum class Opcode : uint8_t {
  kHello = 1,     // address = the epoch the initiator expects (0: any)
  kHelloAck = 2,  // address = the target's epoch; PeerRestarted on mismatch
  kGetDescriptor = 3,
  kDescriptor = 4,  // payload: EncodeDescriptor
  kWrite = 5,       // payload: the bytes to store at address
  kWriteAck = 6,    // sent once the bytes are applied
  kRead = 7,
  kReadData = 8,  // payload: the bytes read
};

struct Header {
  Opcode opcode = Opcode::kHello;
  StatusCode status = StatusCode::kOk;
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
};

void EncodeHeader(const Header& h, uint8_t out[kHeaderSize]);
// ProtocolError for a wrong magic, version, opcode, status or reserved byte.
Result<Header> DecodeHeader(const uint8_t in[kHeaderSize]);

}  // namespace ferry::wire
