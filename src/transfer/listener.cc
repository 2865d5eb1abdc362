#include "transfer/listener.h"

#include <asio.hpp>
#include <list>
#include <mutex>
#include <optional>

#include "common/log.h"
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

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // The GPU context is the listener's; `gpu` is null without a GPU.
  struct Gpu {
    gpu::Copier* copier;
    StagingPool* staging;
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
  void Shutdown() {
    asio::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    timer_.cancel();
    closed_ = true;
  }

  void Drop(const std::string& why) {
    FERRY_LOG_WARN("listener: closing connection from {}: {}", peer_, why);
    Shutdown();
  }

  void ReadHeader() {
    asio::async_read(sock_, asio::buffer(in_), [self = shared_from_this()](auto ec, size_t) {
      if (ec) return self->Shutdown();  // EOF or close: the peer is gone
      self->Dispatch();
    });
  }

  void Dispatch() {
    auto decoded = wire::DecodeHeader(in_);
    if (!decoded.ok()) return Drop(decoded.status().ToString());
    const Header h = decoded.value();
    switch (h.opcode) {
      case Opcode::kHello: {
        StatusCode st =
            (h.addr == 0 || h.addr == cfg_.epoch) ? StatusCode::kOk : StatusCode::kPeerRestarted;
        return Reply({Opcode::kHelloAck, st, h.id, cfg_.epoch, 0}, nullptr);
      }
      case Opcode::kGetDescriptor: {
        desc_ = descriptor_();
        return Reply({Opcode::kDescriptor, StatusCode::kOk, h.id, 0, desc_.size()}, desc_.data());
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
    if (device >= 0)
      return WithStaging([self = shared_from_this(), h, device](char* buf) {
        self->BeginFrame();
        self->WriteToDevice(h, device, buf, 0);
      });
    BeginFrame();
    AsyncReadPayload(sock_, reinterpret_cast<char*>(h.addr), h.length, &lowat_,
                     [self = shared_from_this(), h](asio::error_code ec) {
                       self->EndFrame();
                       if (ec) return self->Shutdown();
                       self->Reply({Opcode::kWriteAck, StatusCode::kOk, h.id, h.addr, 0}, nullptr);
                     });
  }

  // Consumes a rejected write's payload so the stream stays in step.
  void Discard(const Header& h, uint64_t left, StatusCode st) {
    if (left == 0) return Reply({Opcode::kWriteAck, st, h.id, h.addr, 0}, nullptr);
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
      return Reply({Opcode::kReadData, st, h.id, h.addr, 0}, nullptr);
    }
    if (device >= 0)
      return WithStaging([self = shared_from_this(), h, device](char* buf) {
        self->BeginFrame();
        self->ReadFromDevice(h, device, buf, 0);
      });
    Reply({Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length},
          reinterpret_cast<const void*>(h.addr));
  }

  // Runs `fn` on this connection's strand once a staging buffer is free. The
  // connection reads no further frame meanwhile, which bounds what it holds.
  void WithStaging(std::function<void(char*)> fn) {
    gpu_->staging->Take([self = shared_from_this(), fn = std::move(fn)](char* buf) mutable {
      asio::post(self->sock_.get_executor(), [buf, fn = std::move(fn)] { fn(buf); });
    });
  }

  // Runs `next` on the strand once the staged copy has landed, or fails the frame.
  void CopyThen(void* dst, const void* src, size_t n, int device,
                std::function<void(const Status&)> next) {
    gpu_->copier->CopyAsync(dst, src, n, device, nullptr,
                            [self = shared_from_this(), next = std::move(next)](const Status& st) {
                              asio::post(self->sock_.get_executor(), [st, next] { next(st); });
                            });
  }

  // A write into GPU memory, one staging buffer at a time: receive a piece,
  // copy it to the device, and ack only once the last piece has landed (R3).
  void WriteToDevice(const Header& h, int device, char* buf, uint64_t off) {
    const size_t n = std::min<uint64_t>(h.length - off, gpu_->staging->buffer_bytes());
    AsyncReadPayload(
        sock_, buf, n, &lowat_, [self = shared_from_this(), h, device, buf, off, n](auto ec) {
          if (ec) {
            self->gpu_->staging->Give(buf);
            return self->Shutdown();
          }
          char* dst = reinterpret_cast<char*>(h.addr) + off;
          self->CopyThen(dst, buf, n, device, [self, h, device, buf, off, n](const Status& st) {
            if (st.ok() && off + n < h.length) return self->WriteToDevice(h, device, buf, off + n);
            self->gpu_->staging->Give(buf);
            self->EndFrame();
            if (!st.ok()) {
              FERRY_LOG_ERROR("listener: GPU write at 0x{:x} failed: {}", h.addr, st.ToString());
              return self->Discard(h, h.length - off - n, StatusCode::kInternal);
            }
            self->Reply({Opcode::kWriteAck, StatusCode::kOk, h.id, h.addr, 0}, nullptr);
          });
        });
  }

  // A read of GPU memory: copy a piece device-to-host, send it, repeat. The
  // header goes out with the first piece, so a copy error before it can
  // still be reported; after it, the connection is closed and the peer's
  // request fails.
  void ReadFromDevice(const Header& h, int device, char* buf, uint64_t off) {
    const size_t n = std::min<uint64_t>(h.length - off, gpu_->staging->buffer_bytes());
    const char* src = reinterpret_cast<const char*>(h.addr) + off;
    CopyThen(
        buf, src, n, device, [self = shared_from_this(), h, device, buf, off, n](const Status& st) {
          if (!st.ok()) {
            self->gpu_->staging->Give(buf);
            self->EndFrame();
            FERRY_LOG_ERROR("listener: GPU read at 0x{:x} failed: {}", h.addr, st.ToString());
            if (off > 0) return self->Shutdown();
            return self->Reply({Opcode::kReadData, StatusCode::kInternal, h.id, h.addr, 0},
                               nullptr);
          }
          std::array<asio::const_buffer, 2> bufs = {
              asio::buffer(self->out_, off == 0 ? sizeof(self->out_) : 0), asio::buffer(buf, n)};
          if (off == 0) {
            wire::EncodeHeader({Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length},
                               self->out_);
          }
          asio::async_write(self->sock_, bufs, [self, h, device, buf, off, n](auto ec, size_t) {
            if (!ec && off + n < h.length) return self->ReadFromDevice(h, device, buf, off + n);
            self->gpu_->staging->Give(buf);
            self->EndFrame();
            if (ec) return self->Shutdown();
            self->ReadHeader();
          });
        });
  }

  // Sends a header and, when `payload` is set, h.length bytes; then reads on.
  void Reply(const Header& h, const void* payload) {
    wire::EncodeHeader(h, out_);
    std::array<asio::const_buffer, 2> bufs = {asio::buffer(out_),
                                              asio::buffer(payload, payload ? h.length : 0)};
    BeginFrame();
    asio::async_write(sock_, bufs, [self = shared_from_this()](auto ec, size_t) {
      self->EndFrame();
      if (ec) return self->Shutdown();
      self->ReadHeader();
    });
  }

  // Bounds payload progress: a peer that stalls mid-frame is cut off. A
  // periodic check, so the data path sets a timestamp instead of a timer.
  void BeginFrame() { frame_started_ = Clock::now(); }
  void EndFrame() { frame_started_.reset(); }
  void Watchdog() {
    timer_.expires_after(std::min<Millis>(cfg_.frame_timeout, Millis(500)));
    timer_.async_wait([self = shared_from_this()](auto ec) {
      if (ec || self->closed_) return;
      if (self->frame_started_ && Clock::now() - *self->frame_started_ > self->cfg_.frame_timeout) {
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
  std::string peer_;
  bool closed_ = false;
  int lowat_ = 1;
  std::optional<Clock::time_point> frame_started_;
  uint8_t in_[wire::kHeaderSize];
  uint8_t out_[wire::kHeaderSize];
  std::vector<uint8_t> desc_;
  std::vector<uint8_t> scratch_;
  const std::optional<Gpu> gpu_;
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
      if (staging_) gpu_ = Connection::Gpu{copier, staging_.get()};
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
