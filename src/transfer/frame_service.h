// The seam between the engine's listener and the transports that serve
// frames on it (Transport::frame_service): the listener accepts, reads each
// frame header, validates it and answers the p2p metadata frames itself
// (Hello, GetDescriptor); a frame of any other opcode goes to the service
// that claims it, with the connection it came on.
#pragma once

#include <asio.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/env.h"
#include "transfer/frame_wire.h"

namespace ferry {

// Replies a connection may have pending before it reads no further frame.
inline constexpr size_t kMaxQueuedReplies = 8;

// Room right after a payload that its receive may fill too (AsyncReadPayload,
// tcp/socket_io.h): the start of what follows it on the stream, such as the
// next frame's header, taken in the same call. Never more than `cap`.
struct ReceiveTail {
  uint8_t* buf = nullptr;
  size_t cap = 0;
  size_t got = 0;  // bytes placed at buf
};

// A socket's SO_RCVLOWAT as AsyncReadPayload (tcp/socket_io.h) sets it:
// raised up to `ceiling` while a payload is awaited (0: never), 1 again once
// it is in. `current` is what the socket has now.
struct RcvLowat {
  int ceiling = 0;
  int current = 1;
};

// The most SO_RCVLOWAT is raised to while a payload is awaited
// (RcvLowat::ceiling) on a socket whose io thread polls for `io_spin_us`
// before it sleeps: FERRY_TCP_RCVLOWAT_KIB where set (0: never), else 256 KiB
// for a thread that sleeps at once and none for one that polls. The mark
// spares a sleeping thread wake-ups; a polling thread finds nothing ready
// under it and sleeps instead. On the 2-core VM (2026-12-03, 3 rounds, ratios
// to raw streams, 1 MiB x 16), polling, 0 against 256 KiB: reads 0.81 / 0.70,
// writes 0.92 / 0.77; not polling: reads 0.61 / 0.74, writes 0.72 / 0.75.
inline int RcvLowatCeiling(int io_spin_us) {
  const int64_t kib = env::GetIntIn("FERRY_TCP_RCVLOWAT_KIB", -1, 4096, -1);
  if (kib >= 0) return static_cast<int>(kib << 10);
  return io_spin_us > 0 ? 0 : 256 << 10;
}

// Bounds the frames (or replies) handled one inside another on a stack, by
// count and by payload bytes: past either, the next goes through the io
// queue, which bounds the stack and lets the thread's other sockets have
// their turn. Used on one strand.
class StackBudget {
 public:
  constexpr StackBudget(int calls, uint64_t bytes) : max_calls_(calls), max_bytes_(bytes) {}
  bool Allows() const { return calls_ < max_calls_ && bytes_ < max_bytes_; }
  // Runs `fn` on this stack; the bytes counted are forgotten once the
  // outermost call returns.
  template <typename Fn>
  void Run(Fn&& fn) {
    ++calls_;
    fn();
    if (--calls_ == 0) bytes_ = 0;
  }
  // Payload bytes of what is handled inside a Run.
  void Count(uint64_t bytes) {
    if (calls_ > 0) bytes_ += bytes;
  }

 private:
  const int max_calls_;
  const uint64_t max_bytes_;
  int calls_ = 0;
  uint64_t bytes_ = 0;
};

// One listener connection, as a service sees it. Every call is made on the
// connection's strand: from FrameService::Serve, from a handler of an
// operation on socket(), or from a function given to Post.
class FrameConnection {
 public:
  virtual ~FrameConnection() = default;

  virtual asio::ip::tcp::socket& socket() = 0;
  // The socket's SO_RCVLOWAT, for AsyncReadPayload.
  virtual RcvLowat* rcv_lowat() = 0;
  // Where a payload's receive may put the next frame's header, which the
  // connection then reads no more (valid while the frame is served, before
  // its ReadNext).
  virtual ReceiveTail* header_tail() = 0;
  // The peer's address, for logs.
  virtual const std::string& peer() const = 0;
  // Runs `fn` on the strand.
  virtual void Post(std::function<void()> fn) = 0;
  // Keeps the connection alive, for handlers that outlive the call.
  virtual std::shared_ptr<FrameConnection> self() = 0;

  // Replies go out in frame order: reserve a slot when the frame is read,
  // fill it when the reply is ready. `sent` runs once the payload has been
  // written, or at shutdown; `payload` (header.length bytes when not null)
  // must stay valid until then. A header flagged wire::kFlagCrc32c has the
  // payload's CRC-32C sent after it, summed as it is sent.
  struct Slot;
  virtual std::shared_ptr<Slot> Reserve() = 0;
  virtual void Fill(const std::shared_ptr<Slot>& slot, const wire::Header& header,
                    const void* payload, std::function<void()> sent = nullptr) = 0;
  // Reserve and Fill at once: a reply that is ready now.
  void Reply(const wire::Header& header, const void* payload,
             std::function<void()> sent = nullptr) {
    Fill(Reserve(), header, payload, std::move(sent));
  }
  // Runs `fn` once every queued reply has been written.
  virtual void WhenDrained(std::function<void()> fn) = 0;
  // While held, queued replies wait: the service writes on the socket itself.
  virtual void HoldReplies(bool hold) = 0;

  // Reads the next frame, unless kMaxQueuedReplies replies are pending (it
  // resumes once one is written). A service calls it once per frame served,
  // when it may read on.
  virtual void ReadNext() = 0;
  // Closes the connection: the peer went away, or the stream is out of step.
  virtual void Shutdown() = 0;
  // Shutdown, logged with `why`.
  virtual void Drop(const std::string& why) = 0;
  // Brackets each socket operation of a frame: a peer that makes no
  // progress within the listener's frame timeout is cut off.
  virtual void BeginFrame() = 0;
  virtual void EndFrame() = 0;
};

class FrameService {
 public:
  virtual ~FrameService() = default;
  // Whether frames with this opcode are this service's. Fixed.
  virtual bool Serves(wire::Opcode opcode) const = 0;
  // Serves one frame whose header is `h`, its payload unread. Must end, now
  // or later, with conn.ReadNext() or a close.
  virtual void Serve(FrameConnection& conn, const wire::Header& h) = 0;
};

}  // namespace ferry
