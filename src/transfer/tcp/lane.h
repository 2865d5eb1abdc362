// One TCP connection of an initiator to a peer's listener. The lane takes
// tasks from its ChunkQueue, up to a window of them (max_in_flight; see
// Window()) on the wire at once, and matches replies in order. All lane state
// is touched only on the lane's strand.
//
// Failure handling: a connect error, a reset, a malformed reply or a passed
// deadline fails every task the lane has sent, and every task still in its
// queue, and closes the socket; the next kick with work queued reconnects. A Hello carrying the
// expected epoch opens each connection, so a restarted peer fails the tasks with PeerRestarted
// instead of writing into the new process at stale addresses. With a cluster secret the Hello is
// the authenticated handshake (transfer/handshake.h); a peer that fails it fails the tasks with
// Unauthenticated, and nothing is sent to it.
//
// With `checksum`, a write whose bytes the target finds corrupted fails
// with ProtocolError and is not applied; a read that arrives corrupted
// fails the same way, its local bytes unspecified. The connection stays up:
// only the payload was wrong, the stream is in step.
#pragma once

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/spin_lock.h"
#include "transfer/batch.h"
#include "transfer/frame_service.h"
#include "transfer/frame_wire.h"

namespace ferry {

class Segment;

// Chunks waiting for a lane. A peer's lanes share one by default, so each
// takes the next chunk whenever its window has room and a batch never waits
// on one lane's backlog while the others idle. Thread safe.
class ChunkQueue {
 public:
  // Whether a peer's lanes on `io_threads` threads share one queue, or each
  // has its own and gets every n-th chunk (FERRY_TCP_SHARED_QUEUE, 0 or 1,
  // decides where set).
  static bool Shared(size_t io_threads);

  // `sharers`: how many lanes take from it.
  explicit ChunkQueue(size_t sharers = 1) : sharers_(std::max<size_t>(sharers, 1)) {}

  // Appends `tasks`; once closed, fails them with Cancelled instead.
  void Push(std::vector<Task> tasks);
  // The bytes of the last Push over the sharers: a lane's share of a batch.
  uint64_t share_bytes() const { return share_bytes_.load(std::memory_order_relaxed); }
  // Moves tasks from the front into `out` while fits(front) holds, but no
  // more than a fair share: the queue's length over its sharers, rounded
  // up. Else the first lane to look fills its whole window and the others
  // find nothing (on the H200, 8 lanes sharing 64 chunks of 64 KiB moved
  // 0.25 of raw streams against 0.36 dealt out round-robin).
  template <typename Fits>
  void TakeWhile(Fits&& fits, std::vector<Task>* out) {
    std::lock_guard lk(mu_);
    const size_t share = (tasks_.size() + sharers_ - 1) / sharers_;
    for (size_t n = 0; n < share && fits(tasks_.front()); ++n) {
      out->push_back(std::move(tasks_.front()));
      tasks_.pop_front();
    }
  }
  bool empty() const;
  // Fails every queued task with `st`.
  void FailAll(const Status& st);
  // Fails the queued tasks whose deadline has passed.
  void FailExpired();
  // FailAll(Cancelled), and later pushes fail at once.
  void Close();

 private:
  const size_t sharers_;
  std::atomic<uint64_t> share_bytes_{0};
  mutable SpinLock mu_;     // every lane takes it, for a few tasks at a time
  std::deque<Task> tasks_;  // guarded by mu_
  bool closed_ = false;     // guarded by mu_
};

class Lane : public std::enable_shared_from_this<Lane> {
 public:
  struct Config {
    asio::ip::tcp::endpoint peer;
    std::string peer_name;
    uint64_t epoch = 0;     // the epoch of the descriptor the tasks' addresses came from
    int max_in_flight = 4;  // raised for small chunks: see Window()
    int gpu_window = 8;     // requests to the target's GPU memory
    // Writes carry a CRC-32C and reads ask for one (EngineOptions::tcp_checksum).
    bool checksum = false;
    int rcv_lowat_ceiling = 0;              // RcvLowat: the most a payload's receive raises it to
    uint64_t small_window_bytes = 1 << 20;  // what small chunks may fill on the wire
    // Small chunks may fill half a lane's share of the last batch instead,
    // up to kMaxFollowedWindow, where that is more (see SmallWindowBytes).
    bool small_window_follows_share = false;
    Millis connect_timeout{5000};
    Millis progress_timeout{30000};
    std::shared_ptr<const auth::Key> key;  // the cluster secret; null: none
  };

  // The chunks of host memory a lane keeps on the wire for
  // EngineOptions::tcp_chunks_in_flight `option`, its lanes sharing a queue
  // or not; and those of requests to GPU memory at the target, whose staging
  // is sized to match.
  static int ChunksInFlight(int option, bool shared_queue) {
    return option > 0 ? option : shared_queue ? 2 : 4;
  }
  static int GpuWindow(int option) { return 2 * (option > 0 ? option : 4); }
  // The bytes small chunks may fill on the wire where that makes more of
  // them than ChunksInFlight (16 at most): `kib` where it is 0 or more, else
  // 256 KiB with a shared queue and 1 MiB without.
  static uint64_t SmallWindowBytes(int64_t kib, bool shared_queue) {
    return kib >= 0 ? static_cast<uint64_t>(kib) << 10 : shared_queue ? 256 << 10 : 1 << 20;
  }
  // With a shared queue and no FERRY_TCP_WINDOW_KIB, small chunks go out in
  // two rounds of a lane's share: on the H200 machine 64 KiB x 64 (512 KiB
  // a lane) moved most with 256 KiB, and 64 KiB x 128 (1 MiB a lane) with
  // 512 KiB, writes 21.7 against 18.2 GB/s at 256 and 17.9 at 1 MiB.
  static constexpr uint64_t kMaxFollowedWindow = 512 << 10;

  Lane(asio::io_context& io, Config cfg, std::weak_ptr<Segment> segment,
       std::shared_ptr<ChunkQueue> queue);

  // Looks at the queue, on the strand: connects if there is work and no
  // connection, sends what the window allows. Call after each Push.
  void Kick();
  // Fails everything sent with Cancelled and takes nothing more. The queue
  // is its owner's to close.
  void Close();

 private:
  enum class State { kIdle, kConnecting, kReady, kClosed };
  struct InFlight {
    Task task;
    uint64_t id;
    bool crc;  // sent with kFlagCrc32c
  };

  void KickNow();
  void Connect();
  void OnConnected(uint64_t gen, const Status& hello);
  size_t Window(const Task& t) const;
  void Pump();
  void ReadReply(uint64_t gen);
  void OnReply(uint64_t gen);
  size_t TakeFromInbox(void* dst, size_t n);
  void Complete(const Status& st);
  void Fail(const Status& st);
  void ArmTimer();
  void OnTimer();
  Status Remote(const wire::Header& h, bool crc) const;
  void ReadChecked(uint64_t gen);
  void ReadPieces(uint64_t gen, uint64_t at);

  asio::strand<asio::io_context::executor_type> strand_;
  asio::ip::tcp::socket sock_;
  asio::steady_timer timer_;
  const Config cfg_;
  std::weak_ptr<Segment> segment_;

  State state_ = State::kIdle;
  uint64_t gen_ = 0;  // bumped per connection; stale handlers see a mismatch
  bool writing_ = false;
  bool timer_armed_ = false;
  RcvLowat lowat_;  // the socket's SO_RCVLOWAT
  uint64_t next_id_ = 1;
  Clock::time_point last_progress_;
  Deadline connect_deadline_;
  const std::shared_ptr<ChunkQueue> queue_;  // not yet sent
  std::deque<InFlight> inflight_;            // sent, reply pending, in wire order
  // The frames of the write in flight: each one's header and, for a
  // checksummed write, its trailer. Cleared only between writes.
  struct Outgoing {
    uint8_t header[wire::kHeaderSize];
    uint8_t crc[wire::kCrcBytes];
  };
  static constexpr size_t kMaxGather = 16;
  std::vector<Outgoing> sending_;
  // Replies as they came off the socket, [in_begin_, in_end_) not yet taken:
  // one receive brings every reply there, so several acks cost one call. A
  // read's payload bytes that came along are copied out of it.
  uint8_t inbox_[1024];
  size_t in_begin_ = 0, in_end_ = 0;
  ReceiveTail tail_;  // a small read payload's receive fills the inbox after it
  static constexpr uint64_t kTailedReadBytes = 128 << 10;
  StackBudget inline_{64, 512 << 10};  // replies ReadReply takes from the inbox on its stack
  uint8_t in_crc_[wire::kCrcBytes];    // that of the read being received
};

}  // namespace ferry
