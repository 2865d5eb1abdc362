#include "transfer/shm/memfd_server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio.hpp>
#include <list>
#include <random>
#include <utility>

#include "common/fd_passing.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "transfer/memory_registry.h"
#include "transfer/peer_memfd.h"

namespace ferry {

namespace {

using asio::local::stream_protocol;
using namespace memfd_wire;

// Connections beyond this are closed at once. A peer holds one only while it
// maps a buffer.
constexpr size_t kMaxConnections = 64;

// Not inherited by the children the application runs.
void CloseOnExec(int fd) { fcntl(fd, F_SETFD, FD_CLOEXEC); }

// A duplicate of the memfd `ref` names, or -1 when it is not registered now.
// Duplicated while registered, so a region freed meanwhile cannot hand out
// another file under a reused fd number.
int Duplicate(const MemoryRegistry& registry, const MemfdRef& ref) {
  if (ref.addr == 0 && ref.serial == 0) {
    return ref.memfd == registry.control_memfd() ? fcntl(ref.memfd, F_DUPFD_CLOEXEC, 0) : -1;
  }
  auto registered = [&] {
    auto r = registry.Find(ref.addr, 1);
    return r && r->addr == ref.addr && r->serial == ref.serial && r->memfd == ref.memfd;
  };
  if (!registered()) return -1;
  const int fd = fcntl(ref.memfd, F_DUPFD_CLOEXEC, 0);
  // Freeing unregisters, then closes: still registered, so `fd` is its file.
  if (fd >= 0 && !registered()) {
    close(fd);
    return -1;
  }
  return fd;
}

// One peer's connection: a request, its reply, the next.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(stream_protocol::socket sock, const MemoryRegistry& registry, Millis timeout,
             std::string peer)
      : sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        registry_(registry),
        timeout_(timeout),
        peer_(std::move(peer)) {}
  ~Connection() {
    if (fd_ >= 0) close(fd_);
  }

  void Start() { Next(); }

 private:
  // The next request; it, and the reply to it, within the timeout.
  void Next() {
    if (closed_) return;
    timer_.expires_after(timeout_);
    timer_.async_wait([self = shared_from_this()](asio::error_code ec) {
      if (!ec) self->Drop("no request within the timeout");
    });
    asio::async_read(sock_, asio::buffer(in_),
                     [self = shared_from_this()](asio::error_code ec, size_t) {
                       if (ec) return self->Shutdown();  // the peer is done, or we closed
                       self->Serve();
                     });
  }

  void Serve() {
    auto ref = DecodeMemfdRequest(in_);
    if (!ref.ok()) return Drop(ref.status().message());
    fd_ = Duplicate(registry_, ref.value());
    struct stat st {};
    if (fd_ >= 0 && fstat(fd_, &st) != 0) {
      close(fd_);
      fd_ = -1;
    }
    if (fd_ < 0) {
      FERRY_LOG_WARN("shm: {} asked for memfd {} (region 0x{:x}, serial {}), not registered here",
                     peer_, ref.value().memfd, ref.value().addr, ref.value().serial);
      refused_ = true;
      EncodeMemfdReply(StatusCode::kNotFound, 0, out_);
    } else {
      EncodeMemfdReply(StatusCode::kOk, static_cast<uint64_t>(st.st_size), out_);
    }
    sent_ = 0;
    Reply();
  }

  // Sends the reply, the fd with its first byte; then the next request, or
  // the end after a refusal.
  void Reply() {
    while (sent_ < kReplyBytes && !closed_) {
      const ssize_t n = SendWithFd(sock_.native_handle(), out_ + sent_, kReplyBytes - sent_, fd_);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        if (fd_ >= 0) close(std::exchange(fd_, -1));  // the peer holds it now
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        sock_.async_wait(stream_protocol::socket::wait_write,
                         [self = shared_from_this()](asio::error_code ec) {
                           if (ec) return self->Shutdown();
                           self->Reply();
                         });
        return;
      } else {
        return Shutdown();
      }
    }
    if (refused_) return Shutdown();
    Next();
  }

  void Drop(const std::string& why) {
    if (closed_) return;
    FERRY_LOG_WARN("shm: closing the memfd connection of {}: {}", peer_, why);
    Shutdown();
  }

  void Shutdown() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ec;
    sock_.close(ec);
    timer_.cancel();
    if (fd_ >= 0) close(std::exchange(fd_, -1));
  }

  stream_protocol::socket sock_;
  asio::steady_timer timer_;
  const MemoryRegistry& registry_;
  const Millis timeout_;
  const std::string peer_;
  uint8_t in_[kRequestBytes];
  uint8_t out_[kReplyBytes];
  size_t sent_ = 0;
  int fd_ = -1;  // the memfd being sent, duplicated
  bool refused_ = false;
  bool closed_ = false;
};

}  // namespace

struct MemfdServer::State : std::enable_shared_from_this<State> {
  State(asio::io_context& io, const MemoryRegistry& registry, Millis timeout)
      : registry(registry), timeout(timeout), acceptor(io) {}

  void Accept() {
    acceptor.async_accept(
        [self = shared_from_this()](asio::error_code ec, stream_protocol::socket sock) {
          if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
          if (!ec) self->Admit(std::move(sock));
          self->Accept();
        });
  }

  // Serves `sock` if its process is of our uid, or root, and there is room.
  void Admit(stream_protocol::socket sock) {
    CloseOnExec(sock.native_handle());
    ucred cred{};
    socklen_t len = sizeof(cred);
    std::string refusal;
    if (getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      refusal = "its credentials cannot be read";
    } else if (cred.uid != 0 && cred.uid != geteuid()) {
      refusal = fmt::format("it runs as uid {}; only uid {} and root may map this engine's memory",
                            cred.uid, geteuid());
    }
    const std::string peer = fmt::format("pid {}", cred.pid);
    conns.remove_if([](const auto& c) { return c.expired(); });
    if (refusal.empty() && conns.size() >= kMaxConnections) {
      refusal = std::to_string(kMaxConnections) + " connections already open";
    }
    if (!refusal.empty()) {
      FERRY_LOG_WARN("shm: refusing the memfd connection of {}: {}", peer, refusal);
      asio::error_code ignored;
      sock.close(ignored);
      return;
    }
    auto c = std::make_shared<Connection>(std::move(sock), registry, timeout, peer);
    conns.push_back(c);
    c->Start();
  }

  const MemoryRegistry& registry;
  const Millis timeout;
  stream_protocol::acceptor acceptor;
  std::list<std::weak_ptr<Connection>> conns;  // on the server's thread only
};

Result<std::unique_ptr<MemfdServer>> MemfdServer::Start(const MemoryRegistry& registry,
                                                        Millis timeout) {
  std::unique_ptr<MemfdServer> server(new MemfdServer());
  server->io_ = std::make_unique<asio::io_context>(1);
  auto s = std::make_shared<State>(*server->io_, registry, timeout);
  // Unguessable, so no other process can take it first; peers also check
  // that the socket is this process's.
  std::random_device random;
  const std::string name = fmt::format("ferry-memfd-{}-{:08x}{:08x}", getpid(), random(), random());
  const stream_protocol::endpoint at(std::string(1, '\0') + name);
  asio::error_code ec;
  s->acceptor.open(at.protocol(), ec);
  if (!ec) CloseOnExec(s->acceptor.native_handle());
  if (!ec) s->acceptor.bind(at, ec);
  if (!ec) s->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::IoError("cannot listen for memfd requests: " + ec.message());
  s->Accept();
  server->state_ = std::move(s);
  server->blob_ = EncodeMemfdServer({static_cast<uint32_t>(geteuid()), name});
  server->thread_ = std::thread([io = server->io_.get()] {
    NameThisThread("ferry-memfd");
    io->run();
  });
  return server;
}

MemfdServer::~MemfdServer() {
  if (thread_.joinable()) {
    io_->stop();
    thread_.join();
  }
  // Closes the sockets: their handlers, which hold them, go with `io_`.
  state_.reset();
  io_.reset();
}

}  // namespace ferry
