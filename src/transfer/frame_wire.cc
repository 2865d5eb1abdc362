#include "transfer/frame_wire.h"

#include <string>

#include "common/bytes.h"

namespace ferry::wire {

namespace {
// Hot path: written in place, no allocation.
void PutLe(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
}  // namespace

void EncodeHeader(const Header& h, uint8_t out[kHeaderSize]) {
  PutLe(out, kMagic, 4);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(h.opcode);
  out[6] = static_cast<uint8_t>(h.status);
  out[7] = h.flags;
  PutLe(out + 8, h.id, 8);
  PutLe(out + 16, h.addr, 8);
  PutLe(out + 24, h.length, 8);
}

Result<Header> DecodeHeader(const uint8_t in[kHeaderSize]) {
  ByteReader r(in, kHeaderSize);
  uint32_t magic = r.U32();
  uint8_t version = r.U8();
  uint8_t opcode = r.U8();
  uint8_t status = r.U8();
  uint8_t flags = r.U8();
  Header h;
  h.id = r.U64();
  h.addr = r.U64();
  h.length = r.U64();
  auto bad = [](const std::string& why) {
    return Status::ProtocolError("bad frame header: " + why);
  };
  if (magic != kMagic) return bad("wrong magic");
  if (version != kVersion) return bad("unsupported version " + std::to_string(version));
  if (opcode < static_cast<uint8_t>(Opcode::kHello) || opcode > static_cast<uint8_t>(kLastOpcode)) {
    return bad("unknown opcode " + std::to_string(opcode));
  }
  if (status > static_cast<uint8_t>(kLastStatusCode)) return bad("unknown status");
  h.opcode = static_cast<Opcode>(opcode);
  h.status = static_cast<StatusCode>(status);
  if ((flags & ~kFlagCrc32c) != 0) return bad("unknown flags " + std::to_string(flags));
  const bool data = h.opcode == Opcode::kWrite || h.opcode == Opcode::kRead ||
                    (h.opcode == Opcode::kReadData && h.status == StatusCode::kOk);
  if (flags != 0 && !data) return bad("flags on a frame that takes none");
  h.flags = flags;
  return h;
}

void EncodeCrc(uint32_t crc, uint8_t out[kCrcBytes]) {
  PutLe(out, crc, static_cast<int>(kCrcBytes));
}

uint32_t DecodeCrc(const uint8_t in[kCrcBytes]) {
  ByteReader r(in, kCrcBytes);
  return r.U32();
}

}  // namespace ferry::wire
