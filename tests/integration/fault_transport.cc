#include "integration/fault_transport.h"

#include <array>
#include <asio.hpp>
#include <atomic>
#include <deque>
#include <memory>
#include <string_view>

#include "common/log.h"
#include "transfer/batch.h"
#include "transfer/io_pool.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace ferry::test {

// ---- FaultInjector ----

FaultInjector& FaultInjector::Get() {
  static FaultInjector injector;
  return injector;
}

void FaultInjector::Arm(const Fault& fault) {
  std::lock_guard lk(mu_);
  armed_.push_back(fault);
}

void FaultInjector::Reset() {
  std::lock_guard lk(mu_);
  armed_.clear();
  const uint64_t held = counts_.held;  // still held; the endpoints release them
  counts_ = Counts{};
  counts_.held = held;
  ++release_round_;
}

void FaultInjector::ReleaseHeld() {
  std::lock_guard lk(mu_);
  ++release_round_;
}

FaultInjector::Counts FaultInjector::counts() const {
  std::lock_guard lk(mu_);
  return counts_;
}

uint64_t FaultInjector::release_round() const {
  std::lock_guard lk(mu_);
  return release_round_;
}

void FaultInjector::Count(uint64_t Counts::*field, int64_t delta) {
  std::lock_guard lk(mu_);
  counts_.*field += static_cast<uint64_t>(delta);
}

std::optional<Fault> FaultInjector::Take(Op op, bool frame) {
  for (Fault& f : armed_) {
    const bool frame_kind = f.kind == FaultKind::kDrop || f.kind == FaultKind::kCorrupt;
    if (f.count <= 0 || f.op != op || frame_kind != frame) continue;
    --f.count;
    ++counts_.hits;
    return f;
  }
  return std::nullopt;
}

std::optional<Fault> FaultInjector::TakeTaskFault(Op op) {
  std::lock_guard lk(mu_);
  return Take(op, false);
}

std::optional<Fault> FaultInjector::TakeFrameFault(bool to_target, const wire::Header& h,
                                                   uint64_t* at) {
  using wire::Opcode;
  const bool write = to_target && h.opcode == Opcode::kWrite;
  const bool read = !to_target && h.opcode == Opcode::kReadData && h.status == StatusCode::kOk;
  if ((!write && !read) || h.length == 0) return std::nullopt;
  std::lock_guard lk(mu_);
  auto f = Take(write ? Op::kWrite : Op::kRead, true);
  if (f) {
    *at = h.length / 2;
    counts_.frame_addr = h.addr;
    counts_.frame_length = h.length;
    counts_.frame_at = *at;
  }
  return f;
}

namespace {

using asio::ip::tcp;
using Counts = FaultInjector::Counts;

FaultInjector& Injector() { return FaultInjector::Get(); }

// ---- the proxy ----

// Bytes a frame carries after its header (frame_wire.h).
uint64_t PayloadBytes(const wire::Header& h) {
  using wire::Opcode;
  if (h.opcode == Opcode::kRead) return 0;
  const bool trailer = (h.flags & wire::kFlagCrc32c) != 0 &&
                       (h.opcode == Opcode::kWrite || h.opcode == Opcode::kReadData);
  return h.length + (trailer ? wire::kCrcBytes : 0);
}

// One proxied connection: the initiator's socket and ours to the target,
// on one strand. Each direction reads a header, forwards it, then forwards
// the payload piece by piece, applying the frame's fault if it has one.
class Pipe : public std::enable_shared_from_this<Pipe> {
 public:
  Pipe(tcp::socket client, tcp::endpoint upstream)
      : client_(std::move(client)), target_(client_.get_executor()), upstream_(upstream) {}

  void Start() {
    target_.async_connect(upstream_, [self = shared_from_this()](asio::error_code ec) {
      if (ec) return self->Close();
      asio::error_code ignored;
      self->target_.set_option(tcp::no_delay(true), ignored);
      self->client_.set_option(tcp::no_delay(true), ignored);
      self->ReadHeader(self->up_);
      self->ReadHeader(self->down_);
    });
  }

  // From any thread.
  void Stop() {
    asio::post(client_.get_executor(), [self = shared_from_this()] {
      self->stopped_ = true;
      self->Close();
    });
  }

 private:
  struct Direction {
    explicit Direction(bool to) : to_target(to) {}
    const bool to_target;
    uint8_t header[wire::kHeaderSize];
    std::array<char, 64 << 10> buf;
    uint64_t left = 0;  // payload bytes still to forward
    uint64_t off = 0;   // of the payload, forwarded so far
    std::optional<Fault> fault;
    uint64_t at = 0;  // the payload offset the fault applies at
  };

  tcp::socket& From(const Direction& d) { return d.to_target ? client_ : target_; }
  tcp::socket& To(const Direction& d) { return d.to_target ? target_ : client_; }

  void ReadHeader(Direction& d) {
    auto self = shared_from_this();
    asio::async_read(From(d), asio::buffer(d.header), [self, &d](asio::error_code ec, size_t) {
      if (self->dropped_) return self->AfterDrop(d, ec, true);
      if (ec) return self->Close();
      auto h = wire::DecodeHeader(d.header);
      if (!h.ok()) {
        // Not ours to judge: the far end sees the same bytes and refuses them.
        d.left = UINT64_MAX;
        d.fault.reset();
      } else {
        d.left = PayloadBytes(h.value());
        d.fault = Injector().TakeFrameFault(d.to_target, h.value(), &d.at);
      }
      d.off = 0;
      asio::async_write(self->To(d), asio::buffer(d.header),
                        [self, &d](asio::error_code ec, size_t) {
                          if (self->dropped_) return self->AfterDrop(d, ec, false);
                          if (ec) return self->Close();
                          self->Payload(d);
                        });
    });
  }

  void Payload(Direction& d) {
    if (d.left == 0) return ReadHeader(d);
    uint64_t want = std::min<uint64_t>(d.left, d.buf.size());
    if (d.fault && d.fault->kind == FaultKind::kDrop) {
      if (d.off >= d.at) return Drop(d);
      want = std::min(want, d.at - d.off);
    }
    auto self = shared_from_this();
    From(d).async_read_some(asio::buffer(d.buf.data(), want), [self, &d](asio::error_code ec,
                                                                         size_t n) {
      if (self->dropped_) return self->AfterDrop(d, ec, true);
      if (ec) return self->Close();
      if (d.fault && d.fault->kind == FaultKind::kCorrupt && d.at >= d.off && d.at < d.off + n) {
        d.buf[d.at - d.off] ^= 0x20;
      }
      asio::async_write(self->To(d), asio::buffer(d.buf.data(), n),
                        [self, &d, n](asio::error_code ec, size_t) {
                          if (self->dropped_) return self->AfterDrop(d, ec, false);
                          if (ec) return self->Close();
                          d.off += n;
                          if (d.left != UINT64_MAX) d.left -= n;
                          self->Payload(d);
                        });
    });
  }

  // Mid-payload: the initiator's connection goes at once; the target gets
  // what was forwarded and then the end of the stream, and we read what it
  // still sends until it closes its end. The target's direction drains,
  // from its next handler when it has an operation under way: two reads at
  // once on one socket would leave one of them unwoken.
  void Drop(const Direction& d) {
    dropped_ = true;
    asio::error_code ec;
    client_.shutdown(tcp::socket::shutdown_both, ec);
    client_.close(ec);
    target_.shutdown(tcp::socket::shutdown_send, ec);
    if (!d.to_target) DrainSome();
  }

  // A handler of `d` that completed after a drop; `read` says it read the
  // target's socket. The initiator's direction ends there.
  void AfterDrop(const Direction& d, const asio::error_code& ec, bool read) {
    if (d.to_target) return;
    if (read && ec) return TargetClosed();
    DrainSome();
  }

  void DrainSome() {
    target_.async_read_some(asio::buffer(drain_),
                            [self = shared_from_this()](asio::error_code ec, size_t) {
                              if (ec) return self->TargetClosed();
                              self->DrainSome();
                            });
  }

  void TargetClosed() {
    if (!stopped_) Injector().Count(&Counts::target_closed);
    Close();
  }

  void Close() {
    asio::error_code ec;
    client_.close(ec);
    target_.close(ec);
  }

  tcp::socket client_;
  tcp::socket target_;
  const tcp::endpoint upstream_;
  Direction up_{true};     // initiator to target
  Direction down_{false};  // target to initiator
  bool dropped_ = false;
  bool stopped_ = false;
  std::array<char, 64 << 10> drain_;
};

// Listens on loopback for one endpoint's lanes and pipes each to `upstream`.
class Proxy : public std::enable_shared_from_this<Proxy> {
 public:
  static Result<std::shared_ptr<Proxy>> Start(asio::io_context& io, tcp::endpoint upstream) {
    auto p = std::shared_ptr<Proxy>(new Proxy(io, upstream));
    asio::error_code ec;
    const tcp::endpoint here(asio::ip::make_address("127.0.0.1"), 0);
    p->acceptor_.open(here.protocol(), ec);
    if (!ec) p->acceptor_.bind(here, ec);
    if (!ec) p->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::IoError("fault_tcp proxy: " + ec.message());
    p->port_ = p->acceptor_.local_endpoint(ec).port();
    p->Accept();
    return p;
  }

  uint16_t port() const { return port_; }

  // From any thread: stops accepting and closes every connection.
  void Stop() {
    asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
      asio::error_code ec;
      self->acceptor_.close(ec);
      for (auto& w : self->pipes_) {
        if (auto p = w.lock()) p->Stop();
      }
      self->pipes_.clear();
    });
  }

 private:
  Proxy(asio::io_context& io, tcp::endpoint upstream)
      : io_(io), acceptor_(asio::make_strand(io)), upstream_(upstream) {}

  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_),
                           [self = shared_from_this()](asio::error_code ec, tcp::socket s) {
                             if (ec) return;  // closed
                             Injector().Count(&Counts::accepted);
                             auto pipe = std::make_shared<Pipe>(std::move(s), self->upstream_);
                             std::erase_if(self->pipes_, [](const auto& w) { return w.expired(); });
                             self->pipes_.push_back(pipe);
                             pipe->Start();
                             self->Accept();
                           });
  }

  asio::io_context& io_;
  tcp::acceptor acceptor_;  // on its strand, with pipes_
  const tcp::endpoint upstream_;
  uint16_t port_ = 0;
  std::vector<std::weak_ptr<Pipe>> pipes_;
};

// ---- the endpoint ----

// Counts `t` and its completion; a second completion is counted, not passed on.
Task Counted(Task t, std::weak_ptr<Segment> real) {
  Injector().Count(&Counts::posted);
  auto once = std::make_shared<std::atomic<bool>>(false);
  Task w = t;
  w.on_done = std::make_shared<std::function<void(const Status&)>>(
      [orig = std::move(t), once, real = std::move(real)](const Status& s) {
        if (once->exchange(true)) {
          FERRY_LOG_ERROR("fault_tcp: a task completed twice ({})", s.ToString());
          return Injector().Count(&Counts::completed_twice);
        }
        // tcp marks the segment it was given, which is the proxy's.
        if (s.code() == StatusCode::kPeerRestarted) {
          if (auto seg = real.lock()) seg->MarkStale();
        }
        Injector().Count(&Counts::completed);
        orig.Done(s);
      });
  return w;
}

class FaultEndpoint : public Endpoint, public std::enable_shared_from_this<FaultEndpoint> {
 public:
  FaultEndpoint(asio::io_context& io, std::shared_ptr<Endpoint> inner, std::shared_ptr<Proxy> proxy,
                std::shared_ptr<Segment> via, std::weak_ptr<Segment> real)
      : timer_(asio::make_strand(io)),
        inner_(std::move(inner)),
        proxy_(std::move(proxy)),
        via_(std::move(via)),
        real_(std::move(real)) {}
  ~FaultEndpoint() override { Close(); }

  void Post(std::vector<Task> tasks) override {
    std::vector<Task> pass;
    for (auto& t : tasks) {
      Task w = Counted(std::move(t), real_);
      if (closed_.load()) {
        w.Done(Status::Cancelled("segment closed"));
        continue;
      }
      auto f = Injector().TakeTaskFault(w.op);
      if (!f) {
        pass.push_back(std::move(w));
      } else if (f->kind == FaultKind::kFail) {
        w.Done(Status(f->code, "fault_tcp: injected failure"));
      } else {
        Hold(std::move(w), f->delay);
      }
    }
    if (!pass.empty()) inner_->Post(std::move(pass));
  }

  void Close() override {
    if (closed_.exchange(true)) return;
    std::deque<Held> held;
    {
      std::lock_guard lk(mu_);
      held.swap(held_);
    }
    for (auto& h : held) {
      Injector().Count(&Counts::held, -1);
      h.task.Done(Status::Cancelled("segment closed"));
    }
    inner_->Close();
    proxy_->Stop();
  }

  bool Follow(const SegmentDescriptor& fresh) override { return inner_->Follow(fresh); }

 private:
  struct Held {
    Task task;
    Clock::time_point until;
    uint64_t round;  // the injector's release round when it was held
  };

  void Hold(Task t, Millis delay) {
    const auto until = delay == kUntilReleased ? Clock::time_point::max() : Clock::now() + delay;
    {
      std::lock_guard lk(mu_);
      held_.push_back({std::move(t), until, Injector().release_round()});
    }
    Injector().Count(&Counts::held);
    asio::post(timer_.get_executor(), [self = shared_from_this()] { self->Arm(); });
  }

  // On the timer's strand. A short period: held tasks are few, and a task
  // past its deadline fails within one.
  void Arm() {
    if (armed_) return;
    armed_ = true;
    timer_.expires_after(Millis(2));
    timer_.async_wait([self = shared_from_this()](asio::error_code) {
      self->armed_ = false;
      self->Tick();
    });
  }

  void Tick() {
    std::vector<Task> go, late;
    bool more = false;
    {
      std::lock_guard lk(mu_);
      const auto now = Clock::now();
      const uint64_t round = Injector().release_round();
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->task.deadline.Expired()) {
          late.push_back(std::move(it->task));
        } else if (now >= it->until || it->round < round) {
          go.push_back(std::move(it->task));
        } else {
          ++it;
          continue;
        }
        it = held_.erase(it);
      }
      more = !held_.empty();
    }
    for (auto& t : late) {
      Injector().Count(&Counts::held, -1);
      t.Done(Status::Timeout("deadline passed while fault_tcp held the request"));
    }
    if (!go.empty()) {
      Injector().Count(&Counts::held, -static_cast<int64_t>(go.size()));
      inner_->Post(std::move(go));
    }
    if (more) Arm();
  }

  asio::steady_timer timer_;  // on its strand, with armed_
  bool armed_ = false;
  const std::shared_ptr<Endpoint> inner_;
  const std::shared_ptr<Proxy> proxy_;
  const std::shared_ptr<Segment> via_;  // what tcp's lanes connect to: the proxy
  const std::weak_ptr<Segment> real_;
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::deque<Held> held_;  // guarded by mu_
};

// ---- the transport ----

class FaultTransport : public Transport {
 public:
  static constexpr char kName[] = "fault_tcp";
  static_assert(std::string_view(kName) == kFaultTransport);

  explicit FaultTransport(EngineContext& ctx) : ctx_(ctx) {
    for (const auto& r : RegisteredTransports()) {
      if (std::string_view(r.name) == "tcp") inner_ = r.factory(ctx);
    }
    if (inner_ != nullptr) {
      caps_ = inner_->caps();
    } else {
      caps_.available = false;
    }
    caps_.name = kName;
    caps_.priority = 1000;  // after every real transport: chosen only when forced
  }

  Status CheckOptions() const override {
    return inner_ != nullptr ? inner_->CheckOptions() : Status::Ok();
  }
  const TransportCaps& caps() const override { return caps_; }
  // Peers that offer tcp; this process's own tcp serves its target side.
  bool CanReach(const Segment& segment) const override {
    return inner_ != nullptr && inner_->CanReach(segment);
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    asio::error_code ec;
    auto addr = asio::ip::make_address(segment->host(), ec);
    if (ec) return Status::InvalidArgument("bad peer address " + segment->host());
    asio::io_context& io = ctx_.io.Next();
    FERRY_ASSIGN_OR_RETURN(auto proxy, Proxy::Start(io, tcp::endpoint(addr, segment->port())));
    // tcp connects to what its segment names: one that names the proxy.
    auto via = std::make_shared<Segment>(segment->id(), segment->name(), "127.0.0.1", proxy->port(),
                                         false);
    via->set_descriptor(segment->descriptor());
    auto inner = inner_->Connect(via);
    if (!inner.ok()) {
      proxy->Stop();
      return inner.status();
    }
    return std::shared_ptr<Endpoint>(std::make_shared<FaultEndpoint>(
        io, std::move(inner).value(), std::move(proxy), std::move(via), segment));
  }

  void Stop() override {
    if (inner_ != nullptr) inner_->Stop();
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
  std::unique_ptr<Transport> inner_;  // tcp, made on the same context
};

}  // namespace

FERRY_REGISTER_TRANSPORT(FaultTransport);

}  // namespace ferry::test
