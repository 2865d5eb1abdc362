#include "transfer/tcp/lane.h"

#include <algorithm>
#include <cstring>

#include "common/cache.h"
#include "common/crc32c.h"
#include "common/env.h"
#include "common/event_trace.h"
#include "common/held_work.h"
#include "common/log.h"
#include "transfer/handshake.h"
#include "transfer/segment.h"
#include "transfer/socket_write.h"
#include "transfer/tcp/socket_io.h"

namespace ferry {

using asio::ip::tcp;
using wire::Header;
using wire::Opcode;

// Unset, shared where the lanes run on more than one io thread, where one
// lane can fall behind another (H200, 4 lanes on 4 threads: 1 MiB writes
// 0.70 -> 0.75 of raw streams). On one thread there is nothing to balance,
// and the 2-core VM's 1 MiB reads measured slower shared (0.72 against 0.83).
bool ChunkQueue::Shared(size_t io_threads) {
  static const int64_t knob = env::GetIntIn("FERRY_TCP_SHARED_QUEUE", 0, 1, -1);
  return knob == 1 || (knob == -1 && io_threads > 1);
}

void ChunkQueue::Push(std::vector<Task> tasks) {
  uint64_t bytes = 0;
  for (const auto& t : tasks) bytes += t.length;
  share_bytes_.store(bytes / sharers_, std::memory_order_relaxed);
  {
    std::lock_guard lk(mu_);
    if (!closed_) {
      for (auto& t : tasks) tasks_.push_back(std::move(t));
      return;
    }
  }
  for (auto& t : tasks) t.Done(Status::Cancelled("segment closed"));
}

bool ChunkQueue::empty() const {
  std::lock_guard lk(mu_);
  return tasks_.empty();
}

void ChunkQueue::FailAll(const Status& st) {
  std::deque<Task> all;
  {
    std::lock_guard lk(mu_);
    all.swap(tasks_);
  }
  for (auto& t : all) t.Done(st);  // outside the lock: Done may complete a batch
}

void ChunkQueue::FailExpired() {
  std::vector<Task> expired;
  {
    std::lock_guard lk(mu_);
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (it->deadline.Expired()) {
        expired.push_back(std::move(*it));
        it = tasks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : expired) t.Done(Status::Timeout("deadline passed before the request was sent"));
}

void ChunkQueue::Close() {
  {
    std::lock_guard lk(mu_);
    closed_ = true;
  }
  FailAll(Status::Cancelled("segment closed"));
}

Lane::Lane(asio::io_context& io, Config cfg, std::weak_ptr<Segment> segment,
           std::shared_ptr<ChunkQueue> queue)
    : strand_(asio::make_strand(io)),
      sock_(strand_),
      timer_(strand_),
      cfg_(std::move(cfg)),
      segment_(std::move(segment)),
      queue_(std::move(queue)) {
  sending_.reserve(kMaxGather);  // never reallocated: a write in flight points into it
}

void Lane::Kick() {
  asio::post(strand_, [self = shared_from_this()] {
    FERRY_TRACE(trace::kKicked, 0);
    if (self->state_ != State::kClosed) self->KickNow();
  });
}

void Lane::Close() {
  asio::post(strand_, [self = shared_from_this()] {
    self->Fail(Status::Cancelled("segment closed"));
    self->state_ = State::kClosed;
  });
}

void Lane::KickNow() {
  if (queue_->empty()) return;
  if (state_ == State::kIdle) return Connect();
  if (state_ == State::kReady) Pump();
}

void Lane::Connect() {
  state_ = State::kConnecting;
  lowat_ = {cfg_.rcv_lowat_ceiling, 1};
  in_begin_ = in_end_ = 0;
  const uint64_t gen = ++gen_;
  connect_deadline_ = Deadline::After(cfg_.connect_timeout);
  ArmTimer();
  sock_.async_connect(cfg_.peer, [self = shared_from_this(), gen](asio::error_code ec) {
    if (gen != self->gen_) return;
    if (ec) {
      return self->Fail(
          Status::Unavailable("cannot connect to " + self->cfg_.peer_name + ": " + ec.message()));
    }
    asio::error_code ignored;
    self->sock_.set_option(tcp::no_delay(true), ignored);
    handshake::HelloConfig hc;
    hc.key = self->cfg_.key;
    hc.expected_epoch = self->cfg_.epoch;
    hc.peer_name = self->cfg_.peer_name;
    hc.current = [self, gen] { return gen == self->gen_; };
    handshake::AsyncHello(self->sock_, std::move(hc), [self, gen](Status st, uint64_t) {
      if (gen != self->gen_) return;
      self->OnConnected(gen, st);
    });
  });
}

void Lane::OnConnected(uint64_t gen, const Status& hello) {
  if (hello.code() == StatusCode::kPeerRestarted) {
    if (auto seg = segment_.lock()) seg->MarkStale();
  }
  if (!hello.ok()) return Fail(hello);
  state_ = State::kReady;
  last_progress_ = Clock::now();
  ReadReply(gen);
  Pump();
}

// A request to the target's GPU memory waits there for a copy to or from
// staging before its reply, so more are let on the wire (gpu_window); else
// that copy's latency idles the connection. On the H200, twice the host
// window moved GPU-to-GPU reads from 8.45 to 9.47 GB/s (0.78 -> 0.87 of
// host-memory reads), writes from 9.26 to 9.68.
//
// Host memory gets few where the lanes share a queue (ChunksInFlight): a
// batch's chunks then wait there for whichever lane frees first, where a
// wide window dealt the whole batch out at once and it waited on the
// slowest lane. On the H200 machine (8 lanes, 2026-12-04, 3 rounds each,
// ratios to 8 raw streams) 2 chunks of 512 KiB against 4 moved 1 MiB x 16
// writes 0.69 -> 0.82 and reads 0.61 -> 0.81, and 64 KiB chunks filling
// 256 KiB against 1 MiB moved writes 0.41 -> 0.48, reads 0.37 -> 0.47.
// Small chunks still get up to 16, to keep the socket busy between acks.
size_t Lane::Window(const Task& t) const {
  constexpr size_t kMaxWindow = 16;
  const auto n = static_cast<size_t>(cfg_.max_in_flight);
  if (t.gpu_remote) return static_cast<size_t>(cfg_.gpu_window);
  uint64_t bytes = cfg_.small_window_bytes;
  if (cfg_.small_window_follows_share) {
    bytes =
        std::clamp<uint64_t>(queue_->share_bytes() / 2, bytes, std::max(bytes, kMaxFollowedWindow));
  }
  return std::max(n, std::min<size_t>(kMaxWindow, bytes / std::max<uint64_t>(t.length, 1)));
}

// Sends every task the window lets on the wire in one gathered write, so
// small chunks cost one send for several; the next round starts when it is
// out.
void Lane::Pump() {
  if (writing_ || state_ != State::kReady) return;
  sending_.clear();
  std::vector<asio::const_buffer> bufs;
  std::vector<Task> taken;
  std::vector<uint64_t> traced;                              // the chunks' keys, with tracing on
  std::vector<std::shared_ptr<std::function<void()>>> sent;  // the tasks' on_sent
  // Once per Pump, for the queue's fair share; again only for what a task
  // that was dropped (cancelled, expired) left free.
  for (bool again = true; again;) {
    again = false;
    taken.clear();
    // What the window still lets on the wire, judged by each task in turn.
    queue_->TakeWhile(
        [&](const Task& t) {
          return inflight_.size() + taken.size() < Window(t) &&
                 sending_.size() + taken.size() < kMaxGather;
        },
        &taken);
    for (Task& t : taken) {
      if (t.batch->cancelled()) {
        t.Done(Status::Cancelled("batch freed"));
        again = true;
        continue;
      }
      if (t.deadline.Expired()) {
        t.Done(Status::Timeout("deadline passed before the request was sent"));
        again = true;
        continue;
      }
      const uint64_t id = next_id_++;
      const bool write = t.op == Op::kWrite;
      const uint8_t flags = cfg_.checksum ? wire::kFlagCrc32c : 0;
      Outgoing& out = sending_.emplace_back();
      wire::EncodeHeader(
          {write ? Opcode::kWrite : Opcode::kRead, StatusCode::kOk, id, t.remote, t.length, flags},
          out.header);
      bufs.push_back(asio::buffer(out.header));
      if (write) bufs.push_back(asio::buffer(t.local, t.length));
      if (write && t.on_sent) sent.push_back(t.on_sent);
      if (write && cfg_.checksum) {
        wire::EncodeCrc(crc32c::Value(t.local, t.length), out.crc);
        bufs.push_back(asio::buffer(out.crc));
      }
      if (trace::On()) {
        trace::Mark(trace::kSend, t.remote);
        traced.push_back(t.remote);
      }
      inflight_.push_back({std::move(t), id, cfg_.checksum});
    }
  }
  if (sending_.empty()) return;
  writing_ = true;
  ArmTimer();
  const uint64_t gen = gen_;
  AsyncWriteAll(sock_, std::move(bufs),
                [self = shared_from_this(), gen, traced = std::move(traced),
                 sent = std::move(sent)](asio::error_code ec, size_t) {
                  for (uint64_t key : traced) trace::Mark(trace::kSent, key);
                  // The kernel holds the bytes now; a failed send fails the tasks.
                  auto release = [&sent] {
                    for (const auto& fn : sent) (*fn)();
                  };
                  if (gen != self->gen_) return release();
                  self->writing_ = false;
                  if (ec) {
                    release();
                    return self->Fail(Status::ConnectionLost("send to " + self->cfg_.peer_name +
                                                             ": " + ec.message()));
                  }
                  self->last_progress_ = Clock::now();
                  // A release can start a waiting stager's copy on this
                  // thread: the next send goes out first.
                  self->Pump();
                  release();
                });
}

// The next reply: from the inbox when a whole header is there, else after a
// receive of whatever has come. Only then, with every reply in hand taken,
// does the window's room go out, all of it in one send (a completed read
// sends its room at once: see OnReply).
void Lane::ReadReply(uint64_t gen) {
  if (gen != gen_) return;
  if (in_end_ - in_begin_ >= wire::kHeaderSize) {
    // Replies in hand are taken on this stack while they are few in a row,
    // and their payloads small; then through the strand's queue, which
    // bounds the stack and lets the io thread's other lanes have their turn.
    if (inline_.Allows()) return inline_.Run([&] { OnReply(gen); });
    return asio::post(strand_, [self = shared_from_this(), gen] { self->ReadReply(gen); });
  }
  std::memmove(inbox_, inbox_ + in_begin_, in_end_ - in_begin_);
  in_end_ -= in_begin_;
  in_begin_ = 0;
  Pump();
  asio::async_read(sock_, asio::buffer(inbox_ + in_end_, sizeof(inbox_) - in_end_),
                   asio::transfer_at_least(wire::kHeaderSize - in_end_),
                   [self = shared_from_this(), gen](asio::error_code ec, size_t n) {
                     if (gen != self->gen_) return;
                     if (ec) {
                       return self->Fail(Status::ConnectionLost(
                           self->cfg_.peer_name + " closed the connection: " + ec.message()));
                     }
                     self->in_end_ += n;
                     self->OnReply(gen);
                   });
}

// Up to `n` bytes from the inbox into `dst`; how many.
size_t Lane::TakeFromInbox(void* dst, size_t n) {
  const size_t have = std::min(n, in_end_ - in_begin_);
  std::memcpy(dst, inbox_ + in_begin_, have);
  in_begin_ += have;
  return have;
}

// A target that checks a write's CRC refuses a mismatch with ProtocolError,
// the one reason it acks a write so.
Status Lane::Remote(const Header& h, bool crc) const {
  const bool write = h.opcode == Opcode::kWriteAck;
  const bool corrupt = write && crc && h.status == StatusCode::kProtocolError;
  return Status(h.status, cfg_.peer_name + " rejected " + (write ? "write" : "read") + " at 0x" +
                              fmt::format("{:x}", h.addr) +
                              (corrupt ? ": its payload failed the checksum; not applied" : ""));
}

void Lane::OnReply(uint64_t gen) {
  last_progress_ = Clock::now();
  auto dh = wire::DecodeHeader(inbox_ + in_begin_);
  in_begin_ += wire::kHeaderSize;
  if (!dh.ok()) return Fail(dh.status());
  const Header h = dh.value();
  FERRY_TRACE(trace::kReply, h.addr);
  if (inflight_.empty() || h.id != inflight_.front().id) {
    return Fail(Status::ProtocolError(cfg_.peer_name + " replied out of order"));
  }
  const Task& t = inflight_.front().task;
  const bool crc = inflight_.front().crc;
  const Opcode want = t.op == Op::kWrite ? Opcode::kWriteAck : Opcode::kReadData;
  if (h.opcode != want) {
    return Fail(Status::ProtocolError(cfg_.peer_name + " sent a mismatched reply"));
  }
  if (h.status != StatusCode::kOk) {
    if (h.length != 0) {
      return Fail(Status::ProtocolError(cfg_.peer_name + " error with payload"));
    }
    Complete(Remote(h, crc));
    return ReadReply(gen);
  }
  if (h.opcode == Opcode::kWriteAck) {
    Complete(Status::Ok());
    return ReadReply(gen);
  }
  if (h.length != t.length) {
    return Fail(Status::ProtocolError(cfg_.peer_name + " sent a wrong read length"));
  }
  // Asked for, a checksum must come; unasked, it must not.
  if (((h.flags & wire::kFlagCrc32c) != 0) != crc) {
    return Fail(Status::ProtocolError(cfg_.peer_name + (crc ? " sent a read without its checksum"
                                                            : " sent an unasked-for checksum")));
  }
  inline_.Count(t.length);
  const size_t have = TakeFromInbox(t.local, t.length);
  auto landed = [self = shared_from_this(), gen, crc](asio::error_code ec) {
    if (gen != self->gen_) return;
    if (ec) {
      return self->Fail(Status::ConnectionLost(self->cfg_.peer_name + " closed mid-payload"));
    }
    FERRY_TRACE(trace::kReadPayloadIn, self->inflight_.front().task.remote);
    self->in_end_ += self->tail_.got;
    self->tail_.got = 0;
    if (crc) return self->ReadChecked(gen);
    self->Complete(Status::Ok());
    // The inbox may hold the next reply's header already: the window's room
    // goes out now, not once the inbox runs dry.
    self->Pump();
    self->ReadReply(gen);
  };
  if (t.on_piece != nullptr && !crc) return ReadPieces(gen, have);
  if (t.write_back_in) WriteBackOwnForDmaUnfenced(t.local, have);
  if (have == t.length) return landed(asio::error_code());
  // The inbox is empty (the payload took all of it). A small read's receive
  // that ends the payload fills it with what came after, the next reply's
  // header first: one receive a reply. A large one's is one receive among
  // several, and it gained nothing measurable on the 2-core VM.
  in_begin_ = in_end_ = 0;
  tail_ = {inbox_, t.length <= kTailedReadBytes ? sizeof(inbox_) : 0, 0};
  AsyncReadPayload(sock_, t.local + have, t.length - have, &lowat_, std::move(landed), &tail_,
                   WriteBackAsFilled{t.write_back_in ? t.local + have : nullptr});
}

// The rest of a read's payload, from `at`, received as a whole payload is
// (the same calls), each whole piece handed on (Task::on_piece) as soon as
// a receive completes it; the last with the read. (Receives stopped at each
// piece's end lost 12%: docs/experiments/piece-receives-2026-12-07.patch.)
void Lane::ReadPieces(uint64_t gen, uint64_t at) {
  const Task& t = inflight_.front().task;
  const uint64_t piece = t.piece > 0 ? t.piece : t.length;
  auto handed = std::make_shared<uint64_t>(0);  // the payload's bytes handed on
  auto hand = [on_piece = t.on_piece, piece, length = t.length, handed](uint64_t in) {
    while (in - *handed >= piece || (in == length && *handed < length)) {
      const uint64_t n = std::min(piece, length - *handed);
      trace::SizedSpan timed(trace::kPieceHandedOn, n);
      (*on_piece)(*handed, n);
      *handed += n;
    }
  };
  auto in = [self = shared_from_this(), gen, hand](asio::error_code ec) {
    if (gen != self->gen_) return;
    if (ec) {
      return self->Fail(Status::ConnectionLost(self->cfg_.peer_name + " closed mid-payload"));
    }
    FERRY_TRACE(trace::kReadPayloadIn, self->inflight_.front().task.remote);
    hand(self->inflight_.front().task.length);
    self->in_end_ += self->tail_.got;
    self->tail_.got = 0;
    self->Complete(Status::Ok());
    self->Pump();
    self->ReadReply(gen);
  };
  tail_ = {inbox_, 0, 0};
  if (at == t.length) return in(asio::error_code());  // the inbox held it
  in_begin_ = in_end_ = 0;                            // the payload took all the inbox had
  if (t.length <= kTailedReadBytes) tail_.cap = sizeof(inbox_);
  auto received = std::make_shared<uint64_t>(at);
  AsyncReadPayload(sock_, t.local + at, t.length - at, &lowat_, std::move(in), &tail_,
                   [hand, received](uint64_t n) { hand(*received += n); });
}

// The trailer of a checksummed read whose payload is in: a mismatch fails
// that read alone, with its local bytes unspecified (already written there:
// the payload is received in place, as without a checksum).
void Lane::ReadChecked(uint64_t gen) {
  // Like the payload, from the inbox or inline when the bytes are there, as
  // they mostly are.
  const size_t have = TakeFromInbox(in_crc_, sizeof(in_crc_));
  auto checked = [self = shared_from_this(), gen](asio::error_code ec) {
    if (gen != self->gen_) return;
    if (ec) {
      return self->Fail(Status::ConnectionLost(self->cfg_.peer_name + " closed mid-payload"));
    }
    self->last_progress_ = Clock::now();
    const Task& t = self->inflight_.front().task;
    if (wire::DecodeCrc(self->in_crc_) != crc32c::Value(t.local, t.length)) {
      FERRY_LOG_WARN("tcp lane to {}: read at 0x{:x}+{} arrived corrupted", self->cfg_.peer_name,
                     t.remote, t.length);
      self->Complete(Status::ProtocolError(self->cfg_.peer_name + ": read at 0x" +
                                           fmt::format("{:x}", t.remote) +
                                           " arrived corrupted (checksum mismatch)"));
    } else {
      if (t.on_piece != nullptr) (*t.on_piece)(0, t.length);  // checked, it goes on whole
      self->Complete(Status::Ok());
    }
    self->ReadReply(gen);
  };
  if (have == sizeof(in_crc_)) return checked(asio::error_code());
  AsyncReadPayload(sock_, reinterpret_cast<char*>(in_crc_) + have, sizeof(in_crc_) - have, &lowat_,
                   std::move(checked));
}

void Lane::Complete(const Status& st) {
  InFlight f = std::move(inflight_.front());
  inflight_.pop_front();
  f.task.Done(st);
  // Nothing more comes in on this lane to push held landings' lines out.
  if (inflight_.empty()) held::RunAll();
}

void Lane::Fail(const Status& st) {
  if (!inflight_.empty()) {
    FERRY_LOG_WARN("tcp lane to {}: failing {} requests sent and those queued: {}", cfg_.peer_name,
                   inflight_.size(), st.ToString());
  }
  ++gen_;  // orphan every pending handler of this connection
  asio::error_code ec;
  sock_.shutdown(tcp::socket::shutdown_both, ec);
  sock_.close(ec);
  timer_.cancel();
  timer_armed_ = false;
  writing_ = false;
  if (state_ != State::kClosed) state_ = State::kIdle;
  auto inflight = std::move(inflight_);
  inflight_.clear();
  for (auto& f : inflight) f.task.Done(st);
  held::RunAll();
  // Queued tasks fail too, also those other lanes of a shared queue would
  // have taken: the peer is unreachable or out of step, so pending requests
  // to it fail promptly instead of one lane at a time.
  queue_->FailAll(st);
}

void Lane::ArmTimer() {
  if (timer_armed_) return;
  timer_armed_ = true;
  timer_.expires_after(Millis(20));
  timer_.async_wait([self = shared_from_this(), gen = gen_](asio::error_code ec) {
    self->timer_armed_ = false;
    if (ec || gen != self->gen_) return;
    self->OnTimer();
  });
}

// Enforces deadlines: a connection that does not come up, a request past its
// deadline, and a connection that makes no progress.
void Lane::OnTimer() {
  if (state_ == State::kConnecting && connect_deadline_.Expired()) {
    return Fail(Status::Unavailable("connect to " + cfg_.peer_name + " timed out"));
  }
  if (!inflight_.empty()) {
    if (inflight_.front().task.deadline.Expired()) {
      return Fail(Status::Timeout("request to " + cfg_.peer_name + " passed its deadline"));
    }
    if (Clock::now() - last_progress_ > cfg_.progress_timeout) {
      return Fail(Status::Timeout(cfg_.peer_name + " made no progress"));
    }
  }
  // Queued tasks past their deadline fail without touching the connection.
  queue_->FailExpired();
  if (!inflight_.empty() || !queue_->empty() || state_ == State::kConnecting) ArmTimer();
}

}  // namespace ferry
