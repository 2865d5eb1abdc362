#include "transfer/listener.h"

#include <sys/socket.h>

#include <algorithm>
#include <asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

#include "common/crc32c.h"
#include "common/env.h"
#include "common/event_trace.h"
#include "common/held_work.h"
#include "common/host.h"
#include "common/log.h"
#include "transfer/frame_service.h"
#include "transfer/frame_wire.h"
#include "transfer/handshake.h"
#include "transfer/socket_write.h"

namespace ferry {

struct FrameConnection::Slot {
  uint8_t header[wire::kHeaderSize];
  const void* payload = nullptr;
  uint64_t length = 0;
  bool crc = false;                  // the payload goes out followed by its CRC-32C
  uint8_t trailer[wire::kCrcBytes];  // written when the reply is sent
  bool ready = false;
  std::function<void()> sent;  // after the write, or at shutdown
};

namespace {

using asio::ip::tcp;
using wire::Header;
using wire::Opcode;

// One peer connection, on its own strand. Frames are read one after another;
// replies go out in frame order through a queue, so a frame a service is
// still working on overlaps reading the next one and writing earlier
// replies. At most kMaxQueuedReplies are pending before reading pauses.
class Connection : public FrameConnection, public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket sock, const Listener::Config& cfg,
             const Listener::DescriptorFn& descriptor, const std::vector<FrameService*>& services,
             log::Refusals& refusals)
      : sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        cfg_(cfg),
        descriptor_(descriptor),
        services_(services),
        refusals_(refusals),
        authed_(cfg.key == nullptr),
        lowat_{cfg.rcv_lowat_ceiling, 1} {}

  void Start() {
    asio::error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    auto remote = sock_.remote_endpoint(ec);
    peer_ = ec ? "?" : remote.address().to_string();
    Watchdog();
    // On the connection's strand: the acceptor's runs this, and a frame in
    // hand is served on the stack of the call that reads its header.
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }

  void Close() {
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->Shutdown(); });
  }

  // ---- FrameConnection ----

  tcp::socket& socket() override { return sock_; }
  RcvLowat* rcv_lowat() override { return &lowat_; }
  ReceiveTail* header_tail() override { return &tail_; }
  const std::string& peer() const override { return peer_; }
  void Post(std::function<void()> fn) override { asio::post(sock_.get_executor(), std::move(fn)); }
  std::shared_ptr<FrameConnection> self() override { return shared_from_this(); }

  std::shared_ptr<Slot> Reserve() override {
    outq_.push_back(std::make_shared<Slot>());
    return outq_.back();
  }

  void Fill(const std::shared_ptr<Slot>& o, const Header& h, const void* payload,
            std::function<void()> sent) override {
    if (closed_) {
      if (sent) sent();
      return;
    }
    wire::EncodeHeader(h, o->header);
    o->payload = payload;
    o->length = payload != nullptr ? h.length : 0;
    o->crc = o->length > 0 && (h.flags & wire::kFlagCrc32c) != 0;
    o->sent = std::move(sent);
    o->ready = true;
    // A reply with a payload (a read's bytes, the descriptor) goes now, with
    // any held before it: its bytes are taken as they are when sent, and the
    // frames after it, writes among them, must not change them first.
    if (HoldBytes() == 0 || o->length > 0) return Flush();
    if (flush_queued_) return;
    flush_queued_ = true;
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->DeferredFlush(); });
  }

  void WhenDrained(std::function<void()> fn) override {
    if (outq_.empty() && !writing_) return fn();
    on_drained_ = std::move(fn);
  }

  void HoldReplies(bool hold) override {
    writing_ = hold;
    if (!hold) Flush();
  }

  // The next frame, unless too many replies are pending; the writer resumes.
  void ReadNext() override {
    if (closed_) return;
    if (outq_.size() >= kMaxQueuedReplies) {
      read_paused_ = true;
      held::RunAll();  // the replies it waits for may be held
      return;
    }
    ReadHeader();
  }

  void Shutdown() override {
    if (closed_) return;
    asio::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    timer_.cancel();
    closed_ = true;
    held::RunAll();
    // Slots not yet filled release what they hold when their work completes.
    for (auto& o : outq_) {
      if (o->ready && o->sent) std::exchange(o->sent, nullptr)();
    }
    outq_.clear();
  }

  void Drop(const std::string& why) override {
    FERRY_LOG_WARN("listener: closing connection from {}: {}", peer_, why);
    Shutdown();
  }

  // Bounds progress: a peer that stalls mid-frame, or stops reading its
  // replies, is cut off. A periodic check, so the data path only counts.
  void BeginFrame() override {
    ++busy_;
    progress_ = Clock::now();
  }
  void EndFrame() override {
    --busy_;
    progress_ = Clock::now();
  }

 private:
  // The most frame bytes whose replies without a payload may wait for the
  // frames read right after them (FERRY_TCP_HOLD_ACKS_KIB, read once; 0: each
  // goes out at once). Held, several small writes' acks leave in one send and
  // wake the initiator once; a tcp chunk's 512 KiB frame is never held, so a
  // large write's window never waits on its acks. On the 2-core VM, 256 KiB
  // moved 64 KiB writes from 0.69 to 0.85 of raw streams (docs/performance.md).
  static uint64_t HoldBytes() {
    static const uint64_t bytes =
        static_cast<uint64_t>(env::GetIntIn("FERRY_TCP_HOLD_ACKS_KIB", 0, 1024, 256)) << 10;
    return bytes;
  }

  void ReadHeader() {
    if (closed_) return;
    // What the last payload's receive took along (header_tail), then, when
    // replies may be held, what is there now.
    size_t got = std::exchange(tail_.got, 0);
    if (got < sizeof(in_) && HoldBytes() > 0) {
      const ssize_t n = ::recv(sock_.native_handle(), in_ + got, sizeof(in_) - got, MSG_DONTWAIT);
      // The end of the stream, or an error, comes out of the read below, once
      // the replies held have gone out.
      if (n > 0) got += static_cast<size_t>(n);
    }
    if (got == sizeof(in_)) return DispatchInHand();
    // Reading waits: the work this thread holds runs, and the replies held
    // go out, first.
    held::RunAll();
    if (HoldBytes() > 0) Flush();
    asio::async_read(sock_, asio::buffer(in_ + got, sizeof(in_) - got),
                     [self = shared_from_this()](auto ec, size_t) {
                       if (ec) return self->Shutdown();  // EOF or close: the peer is gone
                       self->Dispatch();
                     });
  }

  // A whole header in hand, the replies before it may wait for it
  // (DeferredFlush). A small frame is served at once while the frames
  // served so in a row are few, which spares the io thread a trip through
  // its queue (and a poll of the sockets) per frame; else it goes through
  // the queue, which bounds the stack and lets the thread's other
  // connections have their turn. A large frame always does: served at once,
  // its payload is met before much of it has come, and 1 MiB writes lost a
  // tenth on the 2-core VM. Replies held for enough bytes go out first, as
  // DeferredFlush would send them.
  void DispatchInHand() {
    if (held_bytes_ >= HoldBytes()) Flush();
    auto next = wire::DecodeHeader(in_);  // a bad one is dropped by Handle either way
    const bool small = !next.ok() || next.value().length <= kInlineFrameBytes;
    if (small && inline_.Allows()) return inline_.Run([&] { Handle(next); });
    dispatch_queued_ = true;
    asio::post(sock_.get_executor(), [self = shared_from_this()] {
      self->dispatch_queued_ = false;
      self->Dispatch();
    });
  }

  // Replies filled while the next frame was already in hand wait for it, up
  // to HoldBytes() of frames; then, or once reading waits, they go out.
  void DeferredFlush() {
    if (dispatch_queued_ && held_bytes_ < HoldBytes() && !closed_) {
      asio::post(sock_.get_executor(), [self = shared_from_this()] { self->DeferredFlush(); });
      return;
    }
    flush_queued_ = false;
    Flush();
  }

  // Writes every ready reply at the head of the queue in one gathered send:
  // acks of small writes then cost the peer one wake-up for several.
  void Flush() {
    if (writing_ || closed_) return;
    if (outq_.empty()) {
      if (on_drained_) std::exchange(on_drained_, nullptr)();
      return;
    }
    if (!outq_.front()->ready) return;
    writing_ = true;
    held_bytes_ = 0;
    std::vector<asio::const_buffer> bufs;
    std::vector<std::shared_ptr<Slot>> sending;
    for (const auto& o : outq_) {
      if (!o->ready) break;
      if (o->crc) {
        // Summed as it goes out, so the check spans as little time as it can.
        wire::EncodeCrc(crc32c::Value(o->payload, o->length), o->trailer);
      }
      if (trace::On()) {
        auto h = wire::DecodeHeader(o->header);
        const bool data = h.ok() && (h.value().opcode == Opcode::kWriteAck ||
                                     h.value().opcode == Opcode::kReadData);
        if (data) trace::Mark(trace::kTargetReplyOut, h.value().addr);
      }
      bufs.push_back(asio::buffer(o->header));
      if (o->length > 0) bufs.push_back(asio::buffer(o->payload, o->length));
      if (o->crc) bufs.push_back(asio::buffer(o->trailer, wire::kCrcBytes));
      sending.push_back(o);
    }
    BeginFrame();
    AsyncWriteAll(sock_, bufs,
                  [self = shared_from_this(), sending = std::move(sending)](auto ec, size_t) {
                    self->EndFrame();
                    self->writing_ = false;
                    for (auto& o : sending) {
                      if (o->sent) std::exchange(o->sent, nullptr)();
                    }
                    if (ec || self->closed_) return self->Shutdown();
                    for (size_t i = 0; i < sending.size(); ++i) self->outq_.pop_front();
                    if (self->read_paused_ && self->outq_.size() < kMaxQueuedReplies) {
                      self->read_paused_ = false;
                      self->ReadHeader();
                    }
                    self->Flush();
                  });
  }

  void Dispatch() { Handle(wire::DecodeHeader(in_)); }

  void Handle(const Result<Header>& decoded) {
    if (!decoded.ok()) return Drop(decoded.status().ToString());
    const Header h = decoded.value();
    held_bytes_ += h.length;
    inline_.Count(h.length);
    // Only replies carry a status; a request with one set is malformed.
    if (h.status != StatusCode::kOk) {
      return Drop("a request carries status " + std::string(StatusCodeName(h.status)));
    }
    if (!authed_) return Authenticate(h);
    greeted_ = true;
    switch (h.opcode) {
      case Opcode::kHello: {
        if (h.length == auth::kNonceBytes && cfg_.key == nullptr) {
          // An initiator with a secret: we answer without a challenge, and
          // it refuses us; its nonce is read so that it hears why.
          return ReadHandshake(h, &Connection::AckHello);
        }
        if (h.length != 0) return Drop("a hello with a payload of " + std::to_string(h.length));
        return AckHello(h);
      }
      case Opcode::kGetDescriptor: {
        auto desc = std::make_shared<std::vector<uint8_t>>(descriptor_());
        // The reply may wait behind others: `desc` lives until it is written.
        Reply({Opcode::kDescriptor, StatusCode::kOk, h.id, 0, desc->size()}, desc->data(),
              [desc] {});
        return ReadNext();
      }
      default:
        for (FrameService* s : services_) {
          if (s->Serves(h.opcode)) return s->Serve(*this, h);
        }
        return Drop("unexpected opcode " + std::to_string(static_cast<int>(h.opcode)));
    }
  }

  void AckHello(const Header& h) {
    StatusCode st =
        (h.addr == 0 || h.addr == cfg_.epoch) ? StatusCode::kOk : StatusCode::kPeerRestarted;
    Reply({Opcode::kHelloAck, st, h.id, cfg_.epoch, 0}, nullptr);
    ReadNext();
  }

  // ---- the handshake's target side (frame_wire.h), with a secret ----

  // Before the handshake completes, only its own two frames are read.
  void Authenticate(const Header& h) {
    if (!challenged_ && h.opcode == Opcode::kHello && h.length == auth::kNonceBytes) {
      return ReadHandshake(h, &Connection::Challenge);
    }
    if (challenged_ && h.opcode == Opcode::kProof && h.length == auth::kMacBytes) {
      return ReadHandshake(h, &Connection::CheckProof);
    }
    if (h.opcode == Opcode::kHello && h.length == 0) {
      return Refuse(h, "it sent no proof (it holds no cluster secret)");
    }
    Refuse(h, "opcode " + std::to_string(static_cast<int>(h.opcode)) +
                  " before the handshake completed");
  }

  // Reads the handshake frame's payload into hs_, then runs `then`.
  void ReadHandshake(const Header& h, void (Connection::*then)(const Header&)) {
    BeginFrame();
    asio::async_read(sock_, asio::buffer(hs_, h.length),
                     [self = shared_from_this(), h, then](auto ec, size_t) {
                       self->EndFrame();
                       if (ec || self->closed_) return self->Shutdown();
                       ((*self).*then)(h);
                     });
  }

  void Challenge(const Header& h) {
    std::memcpy(theirs_.data(), hs_, theirs_.size());
    auto nonce = auth::NewNonce();
    if (!nonce.ok()) return Drop(nonce.status().ToString());
    mine_ = nonce.value();
    expected_ = h.addr;
    const auth::Mac proof =
        handshake::TargetProof(*cfg_.key, theirs_, mine_, cfg_.epoch, expected_);
    std::memcpy(challenge_, mine_.data(), mine_.size());
    std::memcpy(challenge_ + mine_.size(), proof.data(), proof.size());
    challenged_ = true;
    // challenge_ lives as long as the connection, past the reply's write.
    Reply({Opcode::kChallenge, StatusCode::kOk, h.id, cfg_.epoch, sizeof(challenge_)}, challenge_);
    ReadNext();
  }

  void CheckProof(const Header& h) {
    auth::Mac proof{};
    std::memcpy(proof.data(), hs_, proof.size());
    const auth::Mac want =
        handshake::InitiatorProof(*cfg_.key, theirs_, mine_, cfg_.epoch, expected_);
    if (!auth::SameMac(proof, want)) {
      return Refuse(h, "wrong proof (another cluster secret, or a replayed handshake)");
    }
    authed_ = true;
    greeted_ = true;
    AckHello({Opcode::kHello, StatusCode::kOk, h.id, expected_, 0});
  }

  // Counts and logs the refusal, tells the peer where its frame has a reply,
  // and closes once that is written. Nothing more is read from it.
  void Refuse(const Header& h, const std::string& why) {
    refusals_.Add(peer_, why);
    if (h.opcode == Opcode::kHello || h.opcode == Opcode::kProof) {
      Reply({Opcode::kHelloAck, StatusCode::kUnauthenticated, h.id, 0, 0}, nullptr);
    } else if (h.opcode == Opcode::kGetDescriptor) {
      Reply({Opcode::kDescriptor, StatusCode::kUnauthenticated, h.id, 0, 0}, nullptr);
    } else {
      return Shutdown();  // a memory operation: not even its payload is read
    }
    WhenDrained([self = shared_from_this()] { self->Shutdown(); });
  }

  void Watchdog() {
    timer_.expires_after(
        std::clamp(std::min(cfg_.frame_timeout, cfg_.handshake_timeout), Millis(10), Millis(500)));
    timer_.async_wait([self = shared_from_this()](auto ec) {
      if (ec || self->closed_) return;
      if (!self->greeted_ && Clock::now() - self->accepted_ >= self->cfg_.handshake_timeout) {
        return self->Drop(self->authed_ ? "no frame within the connect timeout"
                                        : "no handshake within the connect timeout");
      }
      if (self->busy_ > 0 && Clock::now() - self->progress_ > self->cfg_.frame_timeout) {
        return self->Drop("frame timed out");
      }
      self->Watchdog();
    });
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  const Listener::Config& cfg_;
  const Listener::DescriptorFn& descriptor_;
  const std::vector<FrameService*>& services_;
  log::Refusals& refusals_;
  std::string peer_;
  bool closed_ = false;
  // Its first frame arrived, or with a secret its handshake completed.
  bool greeted_ = false;
  // The handshake: done (or not needed), and what it has exchanged so far.
  bool authed_;
  bool challenged_ = false;
  uint64_t expected_ = 0;  // the epoch the initiator expects
  auth::Nonce theirs_{};
  auth::Nonce mine_{};
  uint8_t challenge_[auth::kNonceBytes + auth::kMacBytes];
  uint8_t hs_[std::max(auth::kNonceBytes, auth::kMacBytes)];
  const Clock::time_point accepted_ = Clock::now();
  RcvLowat lowat_;
  int busy_ = 0;  // reads and writes under way
  Clock::time_point progress_ = Clock::now();
  uint8_t in_[wire::kHeaderSize];
  ReceiveTail tail_{in_, sizeof(in_), 0};  // header_tail(): the next header, into in_
  static constexpr uint64_t kInlineFrameBytes = 128 << 10;
  StackBudget inline_{16, 512 << 10};       // frames DispatchInHand serves on its stack
  std::deque<std::shared_ptr<Slot>> outq_;  // replies in frame order
  bool writing_ = false;
  bool read_paused_ = false;
  bool dispatch_queued_ = false;  // a header read whole waits in the queue
  bool flush_queued_ = false;     // a DeferredFlush waits in the queue
  uint64_t held_bytes_ = 0;       // frame bytes read since replies last went out
  std::function<void()> on_drained_;
};

class ListenerImpl : public Listener {
 public:
  ListenerImpl(asio::io_context& io, const Config& cfg, DescriptorFn descriptor,
               std::vector<FrameService*> services)
      : io_(io),
        cfg_(cfg),
        descriptor_(std::move(descriptor)),
        services_(std::move(services)),
        acceptor_(asio::make_strand(io)) {}

  Status Bind() {
    asio::error_code ec;
    auto addr = asio::ip::make_address(cfg_.host, ec);
    if (ec) return Status::InvalidArgument("bad listen address '" + cfg_.host + "'");
    if (cfg_.key == nullptr && !IsLoopbackHost(cfg_.host)) {
      FERRY_LOG_WARN(
          "listener: {} is not a loopback address and no cluster secret is set ({}): any "
          "process that reaches it can read and write this engine's registered memory",
          cfg_.host, auth::kKeyFileEnv);
    }
    tcp::endpoint ep(addr, cfg_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status::Unavailable("cannot listen on " + cfg_.host + ":" + std::to_string(cfg_.port) +
                                 ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }
  uint64_t auth_failures() const override { return refusals_.count(); }

  void Stop() override {
    asio::post(acceptor_.get_executor(), [this] {
      asio::error_code ec;
      acceptor_.close(ec);
    });
    std::lock_guard lk(mu_);
    for (auto& e : conns_) {
      if (auto c = e.conn.lock()) c->Close();
    }
    conns_.clear();
  }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(cfg_.place ? cfg_.place() : io_),
                           [this](auto ec, tcp::socket sock) {
                             if (ec == asio::error::operation_aborted) return;
                             asio::error_code gone;
                             const asio::ip::address source =
                                 ec ? asio::ip::address() : sock.remote_endpoint(gone).address();
                             if (!ec && !gone) {  // else the peer left before it was accepted
                               auto c = std::make_shared<Connection>(
                                   std::move(sock), cfg_, descriptor_, services_, refusals_);
                               const std::string refusal = Admit(source, c);
                               if (refusal.empty()) {
                                 c->Start();
                               } else {
                                 FERRY_LOG_WARN("listener: refusing a connection from {}: {}",
                                                source.to_string(), refusal);
                                 c->Close();
                               }
                             }
                             if (acceptor_.is_open()) Accept();
                           });
  }

  struct Entry {
    asio::ip::address source;
    std::weak_ptr<Connection> conn;
  };

  // Empty when `c`, from `source`, takes a slot; else why it may not.
  std::string Admit(const asio::ip::address& source, const std::shared_ptr<Connection>& c) {
    std::lock_guard lk(mu_);
    conns_.remove_if([](const Entry& e) { return e.conn.expired(); });
    if (conns_.size() >= cfg_.max_connections) {
      return std::to_string(cfg_.max_connections) + " already open";
    }
    const auto from_source = std::count_if(conns_.begin(), conns_.end(),
                                           [&](const Entry& e) { return e.source == source; });
    if (static_cast<size_t>(from_source) >= cfg_.max_connections_per_source) {
      return std::to_string(cfg_.max_connections_per_source) + " already open from there";
    }
    conns_.push_back({source, c});
    return "";
  }

  asio::io_context& io_;
  const Config cfg_;
  const DescriptorFn descriptor_;
  const std::vector<FrameService*> services_;
  tcp::acceptor acceptor_;
  log::Refusals refusals_{"listener"};  // of the handshake
  uint16_t port_ = 0;
  std::mutex mu_;
  std::list<Entry> conns_;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<Listener>> Listener::Start(asio::io_context& io, const Config& config,
                                                  DescriptorFn descriptor,
                                                  std::vector<FrameService*> services) {
  auto l = std::make_unique<ListenerImpl>(io, config, std::move(descriptor), std::move(services));
  FERRY_RETURN_IF_ERROR(l->Bind());
  return std::unique_ptr<Listener>(std::move(l));
}

}  // namespace ferry
