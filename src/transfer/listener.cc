#include "transfer/listener.h"

#include <asio.hpp>
#include <deque>
#include <list>
#include <mutex>
#include <optional>

#include "common/log.h"
#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "transfer/memory_registry.h"
#include "transfer/socket_io.h"
#include "transfer/staging.h"
#include "transfer/wire.h"

namespace ferry {

namespace {

using asio::ip::tcp;
using wire::Header;
using wire::Opcode;

// One peer connection, on its own strand. Frames are read one after another;
// replies go out in frame order through a queue, so a GPU frame's copy
// overlaps reading the next frame and writing earlier replies. At most
// kMaxQueued replies are pending before reading pauses.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // The GPU context is the listener's; absent without a GPU.
  struct Gpu {
    gpu::Copier* copier;
    StagingPool* staging;
    ThreadPool* landing;  // null: land on the strand's thread
  };

  Connection(tcp::socket sock, const Listener::Config& cfg, const MemoryRegistry& registry,
             const Listener::DescriptorFn& descriptor, std::optional<Gpu> gpu)
      : sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        cfg_(cfg),
        registry_(registry),
        descriptor_(descriptor),
        gpu_(gpu) {}

  void Start() {
    asio::error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    auto remote = sock_.remote_endpoint(ec);
    peer_ = ec ? "?" : remote.address().to_string();
    Watchdog();
    ReadHeader();
  }

  void Close() {
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->Shutdown(); });
  }

 private:
  static constexpr size_t kMaxQueued = Listener::kMaxQueuedReplies;

  // A reply slot, reserved when its frame is read and filled when ready.
  struct Out {
    uint8_t header[wire::kHeaderSize];
    const void* payload = nullptr;
    uint64_t length = 0;
    bool ready = false;
    std::function<void()> sent;  // after the write, or at shutdown: returns staging
  };
  using OutPtr = std::shared_ptr<Out>;

  void Shutdown() {
    if (closed_) return;
    asio::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    timer_.cancel();
    closed_ = true;
    // Slots not yet filled release their staging when their copy completes.
    for (auto& o : outq_) {
      if (o->ready && o->sent) std::exchange(o->sent, nullptr)();
    }
    outq_.clear();
  }

  void Drop(const std::string& why) {
    FERRY_LOG_WARN("listener: closing connection from {}: {}", peer_, why);
    Shutdown();
  }

  void ReadHeader() {
    if (closed_) return;
    asio::async_read(sock_, asio::buffer(in_), [self = shared_from_this()](auto ec, size_t) {
      if (ec) return self->Shutdown();  // EOF or close: the peer is gone
      self->Dispatch();
    });
  }

  // The next frame, unless too many replies are pending; the writer resumes.
  void ReadNext() {
    if (closed_) return;
    if (outq_.size() >= kMaxQueued) {
      read_paused_ = true;
      return;
    }
    ReadHeader();
  }

  OutPtr Reserve() {
    outq_.push_back(std::make_shared<Out>());
    return outq_.back();
  }

  void Fill(const OutPtr& o, const Header& h, const void* payload,
            std::function<void()> sent = nullptr) {
    if (closed_) {
      if (sent) sent();
      return;
    }
    wire::EncodeHeader(h, o->header);
    o->payload = payload;
    o->length = payload != nullptr ? h.length : 0;
    o->sent = std::move(sent);
    o->ready = true;
    Flush();
  }

  // Queues a reply that is ready now.
  void Reply(const Header& h, const void* payload, std::function<void()> sent = nullptr) {
    Fill(Reserve(), h, payload, std::move(sent));
  }

  void Flush() {
    if (writing_ || closed_) return;
    if (outq_.empty()) {
      if (on_drained_) std::exchange(on_drained_, nullptr)();
      return;
    }
    if (!outq_.front()->ready) return;
    OutPtr o = outq_.front();
    writing_ = true;
    std::array<asio::const_buffer, 2> bufs = {asio::buffer(o->header),
                                              asio::buffer(o->payload, o->length)};
    BeginFrame();
    asio::async_write(sock_, bufs, [self = shared_from_this(), o](auto ec, size_t) {
      self->EndFrame();
      self->writing_ = false;
      if (o->sent) std::exchange(o->sent, nullptr)();
      if (ec || self->closed_) return self->Shutdown();
      self->outq_.pop_front();
      if (self->read_paused_ && self->outq_.size() < kMaxQueued) {
        self->read_paused_ = false;
        self->ReadHeader();
      }
      self->Flush();
    });
  }

  // Runs `fn` once every queued reply has been written.
  void WhenDrained(std::function<void()> fn) {
    if (outq_.empty() && !writing_) return fn();
    on_drained_ = std::move(fn);
  }

  void Dispatch() {
    auto decoded = wire::DecodeHeader(in_);
    if (!decoded.ok()) return Drop(decoded.status().ToString());
    const Header h = decoded.value();
    switch (h.opcode) {
      case Opcode::kHello: {
        StatusCode st =
            (h.addr == 0 || h.addr == cfg_.epoch) ? StatusCode::kOk : StatusCode::kPeerRestarted;
        Reply({Opcode::kHelloAck, st, h.id, cfg_.epoch, 0}, nullptr);
        return ReadNext();
      }
      case Opcode::kGetDescriptor: {
        auto desc = std::make_shared<std::vector<uint8_t>>(descriptor_());
        // The reply may wait behind others: `desc` lives until it is written.
        Reply({Opcode::kDescriptor, StatusCode::kOk, h.id, 0, desc->size()}, desc->data(),
              [desc] {});
        return ReadNext();
      }
      case Opcode::kWrite:
        return HandleWrite(h);
      case Opcode::kRead:
        return HandleRead(h);
      default:
        return Drop("unexpected opcode " + std::to_string(static_cast<int>(h.opcode)));
    }
  }

  // The range's GPU when it is device memory, -1 for host memory.
  StatusCode Check(const Header& h, int* device) const {
    if (h.length == 0) return StatusCode::kInvalidArgument;
    auto r = registry_.Find(h.addr, h.length);
    if (!r) return StatusCode::kOutOfRange;
    *device = r->kind == gpu::MemoryKind::kDevice ? std::max(r->device, 0) : -1;
    if (*device >= 0 && !gpu_) return StatusCode::kNotSupported;
    return StatusCode::kOk;
  }

  void HandleWrite(const Header& h) {
    if (h.length > wire::kMaxPayload) return Drop("write payload too large");
    int device = -1;
    StatusCode st = Check(h, &device);
    if (st != StatusCode::kOk) {
      FERRY_LOG_WARN("listener: write from {} rejected: {} at 0x{:x}+{}", peer_, StatusCodeName(st),
                     h.addr, h.length);
      return Discard(h, h.length, st);
    }
    if (device >= 0) {
      if (h.length <= gpu_->staging->buffer_bytes()) return WriteToDevice(h, device);
      return Serially(h, device, &Connection::WriteToDeviceSerial);
    }
    BeginFrame();
    AsyncReadPayload(sock_, reinterpret_cast<char*>(h.addr), h.length, &lowat_,
                     [self = shared_from_this(), h](asio::error_code ec) {
                       self->EndFrame();
                       if (ec) return self->Shutdown();
                       self->Reply({Opcode::kWriteAck, StatusCode::kOk, h.id, h.addr, 0}, nullptr);
                       self->ReadNext();
                     });
  }

  // Consumes a rejected write's payload so the stream stays in step.
  void Discard(const Header& h, uint64_t left, StatusCode st) {
    if (left == 0) {
      Reply({Opcode::kWriteAck, st, h.id, h.addr, 0}, nullptr);
      return ReadNext();
    }
    if (scratch_.empty()) scratch_.resize(64 << 10);
    size_t n = std::min<uint64_t>(left, scratch_.size());
    BeginFrame();
    asio::async_read(sock_, asio::buffer(scratch_.data(), n),
                     [self = shared_from_this(), h, left, st](auto ec, size_t got) {
                       self->EndFrame();
                       if (ec) return self->Shutdown();
                       self->Discard(h, left - got, st);
                     });
  }

  void HandleRead(const Header& h) {
    if (h.length > wire::kMaxPayload) return Drop("read length too large");
    int device = -1;
    StatusCode st = Check(h, &device);
    if (st != StatusCode::kOk) {
      FERRY_LOG_WARN("listener: read from {} rejected: {} at 0x{:x}+{}", peer_, StatusCodeName(st),
                     h.addr, h.length);
      Reply({Opcode::kReadData, st, h.id, h.addr, 0}, nullptr);
      return ReadNext();
    }
    if (device >= 0) {
      if (h.length <= gpu_->staging->buffer_bytes()) return ReadFromDevice(h, device);
      return Serially(h, device, &Connection::ReadFromDeviceSerial);
    }
    Reply({Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length},
          reinterpret_cast<const void*>(h.addr));
    ReadNext();
  }

  // Runs `fn` on this connection's strand once a staging buffer is free. The
  // connection reads no further frame meanwhile, which bounds what it holds.
  void WithStaging(std::function<void(char*)> fn) {
    if (char* buf = gpu_->staging->TryTake()) return fn(buf);
    gpu_->staging->Take([self = shared_from_this(), fn = std::move(fn)](char* buf) mutable {
      asio::post(self->sock_.get_executor(), [buf, fn = std::move(fn)] { fn(buf); });
    });
  }

  // Runs `next` on the strand once the staged copy has landed, or failed.
  // The copy is started on the landing pool when there is one, so the socket
  // threads, which bound a read's throughput, make no CUDA calls.
  void CopyThen(void* dst, const void* src, size_t n, int device,
                std::function<void(const Status&)> next) {
    auto copy = [copier = gpu_->copier, dst, src, n, device,
                 done = OnStrand(std::move(next))]() mutable {
      copier->CopyAsync(dst, src, n, device, nullptr, std::move(done));
    };
    if (gpu_->landing == nullptr) return copy();
    gpu_->landing->Post(std::move(copy));
  }
  // The same for a buffer just received; `pool` as for LandStaged.
  void LandThen(void* dst, const char* buf, size_t n, int device, ThreadPool* pool,
                std::function<void(const Status&)> next) {
    LandStaged(pool, *gpu_->copier, dst, buf, n, device, nullptr, OnStrand(std::move(next)));
  }
  std::function<void(const Status&)> OnStrand(std::function<void(const Status&)> next) {
    return [self = shared_from_this(), next = std::move(next)](const Status& st) {
      asio::post(self->sock_.get_executor(), [st, next] { next(st); });
    };
  }

  void GiveBack(char* buf) { gpu_->staging->Give(buf); }

  // A write into GPU memory that fits one staging buffer: receive it, start
  // the copy to the device and read on; the ack goes out once it has
  // landed (R3).
  void WriteToDevice(const Header& h, int device) {
    OutPtr out = Reserve();
    WithStaging([self = shared_from_this(), h, device, out](char* buf) {
      self->BeginFrame();
      AsyncReadPayload(
          self->sock_, buf, h.length, &self->lowat_, [self, h, device, out, buf](auto ec) {
            self->EndFrame();
            if (ec) {
              self->GiveBack(buf);
              return self->Shutdown();
            }
            self->LandThen(reinterpret_cast<void*>(h.addr), buf, h.length, device,
                           self->gpu_->landing, [self, h, out, buf](const Status& st) {
                             self->GiveBack(buf);
                             if (!st.ok()) {
                               FERRY_LOG_ERROR("listener: GPU write at 0x{:x} failed: {}", h.addr,
                                               st.ToString());
                             }
                             StatusCode code = st.ok() ? StatusCode::kOk : StatusCode::kInternal;
                             self->Fill(out, {Opcode::kWriteAck, code, h.id, h.addr, 0}, nullptr);
                           });
            self->ReadNext();
          });
    });
  }

  // A read of GPU memory that fits one staging buffer: copy it device-to-host
  // and read on; the reply is sent, in order, once the copy has landed.
  void ReadFromDevice(const Header& h, int device) {
    OutPtr out = Reserve();
    WithStaging([self = shared_from_this(), h, device, out](char* buf) {
      self->CopyThen(
          buf, reinterpret_cast<const void*>(h.addr), h.length, device,
          [self, h, out, buf](const Status& st) {
            if (!st.ok()) {
              self->GiveBack(buf);
              FERRY_LOG_ERROR("listener: GPU read at 0x{:x} failed: {}", h.addr, st.ToString());
              return self->Fill(out, {Opcode::kReadData, StatusCode::kInternal, h.id, h.addr, 0},
                                nullptr);
            }
            self->Fill(out, {Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length}, buf,
                       [self, buf] { self->GiveBack(buf); });
          });
      self->ReadNext();
    });
  }

  // A frame larger than a staging buffer: once the replies before it are out,
  // `piece` moves it through one buffer a piece at a time, and nothing else
  // is sent (a write's ack, a read's pieces) or read until it is done.
  using Piecewise = void (Connection::*)(const Header&, int, char*, uint64_t);
  void Serially(const Header& h, int device, Piecewise piece) {
    WhenDrained([self = shared_from_this(), h, device, piece] {
      self->WithStaging([self, h, device, piece](char* buf) {
        self->writing_ = true;
        (self.get()->*piece)(h, device, buf, 0);
      });
    });
  }

  // Frames larger than a staging buffer go one piece at a time, with the
  // reply queue drained first and nothing else read meanwhile.
  void WriteToDeviceSerial(const Header& h, int device, char* buf, uint64_t off) {
    const size_t n = std::min<uint64_t>(h.length - off, gpu_->staging->buffer_bytes());
    BeginFrame();
    AsyncReadPayload(
        sock_, buf, n, &lowat_, [self = shared_from_this(), h, device, buf, off, n](auto ec) {
          if (ec) {
            self->EndFrame();
            self->GiveBack(buf);
            return self->Shutdown();
          }
          char* dst = reinterpret_cast<char*>(h.addr) + off;
          // Inline: nothing else is read on this connection meanwhile.
          self->LandThen(
              dst, buf, n, device, nullptr, [self, h, device, buf, off, n](const Status& st) {
                self->EndFrame();
                if (st.ok() && off + n < h.length) {
                  return self->WriteToDeviceSerial(h, device, buf, off + n);
                }
                self->GiveBack(buf);
                self->writing_ = false;
                if (!st.ok()) {
                  FERRY_LOG_ERROR("listener: GPU write at 0x{:x} failed: {}", h.addr,
                                  st.ToString());
                  return self->Discard(h, h.length - off - n, StatusCode::kInternal);
                }
                self->Reply({Opcode::kWriteAck, StatusCode::kOk, h.id, h.addr, 0}, nullptr);
                self->ReadNext();
              });
        });
  }

  // The header goes out with the first piece, so a copy error before it can
  // still be reported; after it, the connection is closed and the peer's
  // request fails.
  void ReadFromDeviceSerial(const Header& h, int device, char* buf, uint64_t off) {
    const size_t n = std::min<uint64_t>(h.length - off, gpu_->staging->buffer_bytes());
    const char* src = reinterpret_cast<const char*>(h.addr) + off;
    BeginFrame();
    CopyThen(
        buf, src, n, device, [self = shared_from_this(), h, device, buf, off, n](const Status& st) {
          if (!st.ok()) {
            self->EndFrame();
            self->GiveBack(buf);
            self->writing_ = false;
            FERRY_LOG_ERROR("listener: GPU read at 0x{:x} failed: {}", h.addr, st.ToString());
            if (off > 0) return self->Shutdown();
            self->Reply({Opcode::kReadData, StatusCode::kInternal, h.id, h.addr, 0}, nullptr);
            return self->ReadNext();
          }
          if (off == 0) {
            wire::EncodeHeader({Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length},
                               self->serial_header_);
          }
          std::array<asio::const_buffer, 2> bufs = {
              asio::buffer(self->serial_header_, off == 0 ? sizeof(self->serial_header_) : 0),
              asio::buffer(buf, n)};
          asio::async_write(self->sock_, bufs, [self, h, device, buf, off, n](auto ec, size_t) {
            self->EndFrame();
            if (!ec && off + n < h.length)
              return self->ReadFromDeviceSerial(h, device, buf, off + n);
            self->GiveBack(buf);
            self->writing_ = false;
            if (ec) return self->Shutdown();
            self->ReadNext();
          });
        });
  }

  // Bounds progress: a peer that stalls mid-frame, or stops reading its
  // replies, is cut off. A periodic check, so the data path only counts.
  void BeginFrame() {
    ++busy_;
    progress_ = Clock::now();
  }
  void EndFrame() {
    --busy_;
    progress_ = Clock::now();
  }
  void Watchdog() {
    timer_.expires_after(std::min<Millis>(cfg_.frame_timeout, Millis(500)));
    timer_.async_wait([self = shared_from_this()](auto ec) {
      if (ec || self->closed_) return;
      if (self->busy_ > 0 && Clock::now() - self->progress_ > self->cfg_.frame_timeout) {
        return self->Drop("frame timed out");
      }
      self->Watchdog();
    });
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  const Listener::Config& cfg_;
  const MemoryRegistry& registry_;
  const Listener::DescriptorFn& descriptor_;
  const std::optional<Gpu> gpu_;
  std::string peer_;
  bool closed_ = false;
  int lowat_ = 1;
  int busy_ = 0;  // reads and writes under way
  Clock::time_point progress_ = Clock::now();
  uint8_t in_[wire::kHeaderSize];
  uint8_t serial_header_[wire::kHeaderSize];
  std::deque<OutPtr> outq_;  // replies in frame order
  bool writing_ = false;
  bool read_paused_ = false;
  std::function<void()> on_drained_;
  std::vector<uint8_t> scratch_;
};

class ListenerImpl : public Listener {
 public:
  ListenerImpl(asio::io_context& io, const Config& cfg, const MemoryRegistry& registry,
               gpu::Copier* copier, DescriptorFn descriptor)
      : io_(io),
        cfg_(cfg),
        registry_(registry),
        descriptor_(std::move(descriptor)),
        acceptor_(asio::make_strand(io)) {
    if (copier != nullptr) {
      staging_ = StagingPool::Create(cfg_.staging_buffers, cfg_.staging_bytes, "listener");
      if (staging_) gpu_ = Connection::Gpu{copier, staging_.get(), cfg_.landing};
    }
  }

  Status Bind() {
    asio::error_code ec;
    auto addr = asio::ip::make_address(cfg_.host, ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "bad listen address '" + cfg_.host + "'");
    tcp::endpoint ep(addr, cfg_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status(StatusCode::kUnavailable, "cannot listen on " + cfg_.host + ":" +
                                                  std::to_string(cfg_.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    asio::post(acceptor_.get_executor(), [this] {
      asio::error_code ec;
      acceptor_.close(ec);
    });
    std::lock_guard lk(mu_);
    for (auto& w : conns_) {
      if (auto c = w.lock()) c->Close();
    }
    conns_.clear();
  }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_), [this](auto ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        auto c = std::make_shared<Connection>(std::move(sock), cfg_, registry_, descriptor_, gpu_);
        bool admitted;
        {
          std::lock_guard lk(mu_);
          conns_.remove_if([](auto& w) { return w.expired(); });
          admitted = conns_.size() < cfg_.max_connections;
          if (admitted) conns_.push_back(c);
        }
        if (admitted) {
          c->Start();
        } else {
          FERRY_LOG_WARN("listener: refusing a connection: {} already open", cfg_.max_connections);
          c->Close();
        }
      }
      if (acceptor_.is_open()) Accept();
    });
  }

  asio::io_context& io_;
  const Config cfg_;
  const MemoryRegistry& registry_;
  const DescriptorFn descriptor_;
  std::unique_ptr<StagingPool> staging_;  // null without a GPU
  std::optional<Connection::Gpu> gpu_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::list<std::weak_ptr<Connection>> conns_;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<Listener>> Listener::Start(asio::io_context& io, const Config& config,
                                                  const MemoryRegistry& registry,
                                                  gpu::Copier* copier, DescriptorFn descriptor) {
  auto l = std::make_unique<ListenerImpl>(io, config, registry, copier, std::move(descriptor));
  FERRY_RETURN_IF_ERROR(l->Bind());
  return std::unique_ptr<Listener>(std::move(l));
}

}  // namespace ferry
