// Same-host peers share memfd buffers (engine-allocated regions and the
// generation page) by passing the file descriptors over a Unix socket with
// SCM_RIGHTS. That needs no ptrace rights over the owner, so a process that
// forbids tracing (non-dumpable, Yama) still shares them, and Ferry never
// weakens it. The shm transport serves them (shm/memfd_server.h) and names its
// socket in its segment blob; this is the asking side, for every transport
// that maps a peer's memfd (shm, cuda_ipc) and for the generation watch.
//
// The socket is in the abstract namespace; the server admits its own uid and
// root (SO_PEERCRED), and the asker checks that the socket is the owner's
// (its pid and uid). Frames are fixed-size and little-endian:
//   request  magic u32 | version u16 | type u16 | memfd i32 | zero u32 |
//            addr u64 | serial u64                                   (32 bytes)
//   reply    magic u32 | version u16 | code u8 | zero u8 | size u64   (16 bytes)
// The reply to a request carries the memfd as SCM_RIGHTS when its code is 0,
// and `size` is the file's size then. A request names a registered region by
// its address, serial and memfd as the owner's descriptor lists them; addr
// and serial 0 name the generation page. Any other request, or a malformed
// frame, closes the connection (a refusal is answered first).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "ferry/status.h"
#include "transfer/descriptor.h"

namespace ferry {

// The transport whose segment blob names the owner's memfd server.
inline constexpr char kMemfdServerTransport[] = "shm";
// A bound for callers without an engine's connect timeout: a same-host owner
// that cannot answer within it is stalled.
inline constexpr Millis kPeerMemfdTimeout{5000};

namespace memfd_wire {
inline constexpr uint32_t kMagic = 0x31464d46;  // "FMF1"
inline constexpr uint16_t kVersion = 1;
inline constexpr uint16_t kGetMemfd = 1;
inline constexpr size_t kRequestBytes = 32;
inline constexpr size_t kReplyBytes = 16;
inline constexpr size_t kMaxName = 100;  // fits sockaddr_un after the leading NUL
}  // namespace memfd_wire

// Where an owner's memfd server listens, as its segment blob says.
struct MemfdServerAddress {
  uint32_t uid = 0;  // the owner's effective uid
  std::string name;  // abstract socket name, without the leading NUL
};
std::string EncodeMemfdServer(const MemfdServerAddress& a);
// nullopt for an empty or malformed blob: the owner serves no memfds.
std::optional<MemfdServerAddress> DecodeMemfdServer(std::string_view blob);

// One memfd of the owner: a registered region's, or (addr and serial 0) the
// generation page's. `length` is how much of it to map.
struct MemfdRef {
  int32_t memfd = -1;
  uint64_t addr = 0;
  uint64_t serial = 0;
  uint64_t length = 0;
};
void EncodeMemfdRequest(const MemfdRef& ref, uint8_t out[memfd_wire::kRequestBytes]);
// ProtocolError for a bad magic, version, type or padding.
Result<MemfdRef> DecodeMemfdRequest(const uint8_t in[memfd_wire::kRequestBytes]);
void EncodeMemfdReply(StatusCode code, uint64_t size, uint8_t out[memfd_wire::kReplyBytes]);

// Whether this process may ask `owner` for memfds: it names a server whose
// uid is ours, or we are root.
bool MayAskForMemfds(const SegmentDescriptor& owner);

// Asks `owner`'s memfd server for `ref` and maps `ref.length` bytes of it
// shared, read-write and populated, then closes the fd. Blocks for at most
// `timeout`. Unavailable when the owner names no server we may use or its
// socket is not the owner's; NotFound when the owner has no such memfd now
// (the descriptor is stale); Timeout; IoError when the file is too small or
// cannot be mapped. Unmap with munmap(base, ref.length).
Result<char*> MapPeerMemfd(const SegmentDescriptor& owner, const MemfdRef& ref, Millis timeout);

}  // namespace ferry
