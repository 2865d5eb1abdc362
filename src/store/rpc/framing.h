// Length-checked frames over a non-blocking stream socket, shared by the
// attach protocol (attach_wire.h, Unix sockets) and the master's socket
// calls (master_wire.h, TCP). A frame is a 28-byte little-endian header, then
// `length` payload bytes:
//   magic u32 | version u16 | type u16 | request id u64 | length u32 |
//   deadline_ms u32 | code u8 | 3 zero bytes
// Each protocol names its magic, version, types and bounds in a Format.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"

namespace ferry::store::framing {

inline constexpr size_t kHeaderBytes = 28;

struct Format {
  const char* name;  // in error messages: "attach", "master"
  uint32_t magic;
  uint16_t version;
  uint16_t last_type;  // types are 1..last_type
  uint32_t max_payload;
  uint32_t max_deadline_ms;
};

struct Frame {
  uint16_t type = 0;
  uint64_t id = 0;
  uint32_t deadline_ms = 0;
  StatusCode code = StatusCode::kOk;
  std::vector<uint8_t> payload;
  int fd = -1;  // received with the frame; the caller owns it
};

// Sends one frame, with `fd` (if >= 0) attached to its first byte.
// InvalidArgument for a payload over the format's bound; Timeout when
// `deadline` passes, ConnectionLost when the peer is gone.
Status Send(const Format& f, int sock, uint16_t type, uint64_t id, uint32_t deadline_ms,
            StatusCode code, std::span<const uint8_t> payload, Deadline deadline, int fd = -1);

// Receives one frame. Waits up to `first_byte` for it to begin (an idle peer
// is not an error), then up to `rest` for the remainder. ProtocolError for a
// bad magic, version, type, length, code or padding, or for more than one fd.
// The payload's memory grows with the bytes that arrive, so a header that
// claims the maximum costs nothing until the bytes come. With `spin`, it
// looks for the first byte that long before it sleeps in poll, so a reply
// that comes within it is seen without a thread wake-up.
Result<Frame> Receive(const Format& f, int sock, Deadline first_byte, Millis rest,
                      std::chrono::microseconds spin = {});

// How long a caller looks for its reply before it sleeps, as Receive's
// `spin`: 2 ms on hosts of 8 cores or more, where waking a thread that slept
// through a long call costs more than the look, and none below, where the
// cores are better left to the peer. `env` (0 to 10000 us) sets it, to
// compare. Read once per name by the caller.
std::chrono::microseconds ReplySpin(const char* env);

}  // namespace ferry::store::framing
