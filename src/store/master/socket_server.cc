#include "store/master/socket_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/host.h"
#include "common/log.h"
#include "common/thread_name.h"

namespace ferry::store {
namespace {

std::string PeerName(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    return fmt::format("ipv4:{}:{}", buf, ntohs(v4->sin_port));
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
  inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
  return fmt::format("ipv6:[{}]:{}", buf, ntohs(v6->sin6_port));
}

}  // namespace

class SocketServer::Impl {
 public:
  struct Conn {
    int fd = -1;
    std::thread thread;
    bool done = false;  // guarded by mu: its thread has returned
  };

  SocketServerOptions o;
  framing::Format format;
  uint16_t greeting = 0;
  Handler handler;
  int listener = -1;
  int wake = -1;  // eventfd: Stop
  int port = 0;
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> calls{0};
  mutable std::mutex mu;
  std::list<Conn> conns;  // guarded by mu
  size_t live = 0;        // guarded by mu: conns not done

  void Accept() {
    NameThisThread("ferry-msock");
    for (;;) {
      pollfd p[2] = {{listener, POLLIN, 0}, {wake, POLLIN, 0}};
      int r = poll(p, 2, 100);
      Reap();
      if (stopping.load()) return;
      if (r <= 0 || !(p[0].revents & POLLIN)) continue;
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      int fd =
          accept4(listener, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard lk(mu);
      if (live >= o.max_connections) {
        // A fresh socket's buffer takes a greeting without blocking.
        constexpr std::string_view kFull = "too many socket connections";
        (void)framing::Send(format, fd, greeting, 0, 0, StatusCode::kUnavailable,
                            {reinterpret_cast<const uint8_t*>(kFull.data()), kFull.size()},
                            Deadline::After(Millis(0)));
        close(fd);
        continue;
      }
      Conn& c = conns.emplace_back();
      c.fd = fd;
      try {
        c.thread = std::thread([this, &c, name = PeerName(peer)] { Serve(c, name); });
        ++live;
      } catch (const std::system_error& e) {  // out of threads: this one is not served
        FERRY_LOG_WARN("master socket: cannot start a connection's thread: {}", e.what());
        close(fd);
        conns.pop_back();
      }
    }
  }

  void Serve(Conn& c, const std::string& peer) {
    NameThisThread("ferry-mconn");
    if (framing::Send(format, c.fd, greeting, 0, 0, StatusCode::kOk, {},
                      Deadline::After(o.frame_timeout))
            .ok()) {
      while (!stopping.load()) {
        auto req = framing::Receive(format, c.fd, Deadline::After(o.idle_timeout), o.frame_timeout);
        if (!req.ok()) {
          // Idle, gone, or a malformed frame: only this connection ends.
          if (req.status().code() == StatusCode::kProtocolError) {
            FERRY_LOG_WARN("master socket: {} closed: {}", peer, req.status().message());
          }
          break;
        }
        if (req.value().fd >= 0) close(req.value().fd);  // not over TCP, but never kept
        SocketReply reply = handler(req.value(), peer);
        calls.fetch_add(1, std::memory_order_relaxed);
        if (!framing::Send(format, c.fd, req.value().type, req.value().id, 0, reply.code,
                           reply.payload, Deadline::After(o.frame_timeout))
                 .ok()) {
          break;
        }
      }
    }
    std::lock_guard lk(mu);
    c.done = true;
    --live;
  }

  // Joins the threads that have returned.
  void Reap() {
    std::list<Conn> finished;
    {
      std::lock_guard lk(mu);
      for (auto it = conns.begin(); it != conns.end();) {
        auto next = std::next(it);
        if (it->done) finished.splice(finished.end(), conns, it);
        it = next;
      }
    }
    for (Conn& c : finished) {
      c.thread.join();
      close(c.fd);
    }
  }
};

Result<std::unique_ptr<SocketServer>> SocketServer::Start(const SocketServerOptions& o,
                                                          const framing::Format& format,
                                                          uint16_t greeting, Handler handler) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string host = Unbracketed(o.host);
  const std::string port = std::to_string(o.port);
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Status::Unavailable("master socket: cannot resolve " + o.host + ": " + gai_strerror(rc));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return Status::Unavailable(
        fmt::format("master socket: cannot listen on {}:{}: {}", o.host, o.port, why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->format = format;
  impl->greeting = greeting;
  impl->handler = std::move(handler);
  impl->listener = fd;
  impl->port =
      ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                       : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  impl->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake < 0) {
    close(fd);
    return Status::FromErrno(errno, "eventfd");
  }
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->Accept(); });
  return std::unique_ptr<SocketServer>(new SocketServer(std::move(impl)));
}

SocketServer::SocketServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SocketServer::~SocketServer() {
  impl_->stopping = true;
  uint64_t one = 1;
  (void)!write(impl_->wake, &one, sizeof one);
  impl_->acceptor.join();
  {
    std::lock_guard lk(impl_->mu);
    for (auto& c : impl_->conns) shutdown(c.fd, SHUT_RDWR);  // wakes its thread
  }
  for (auto& c : impl_->conns) {
    c.thread.join();
    close(c.fd);
  }
  close(impl_->listener);
  close(impl_->wake);
}

int SocketServer::port() const { return impl_->port; }

size_t SocketServer::connections() const {
  std::lock_guard lk(impl_->mu);
  return impl_->live;
}

uint64_t SocketServer::calls() const { return impl_->calls.load(); }

}  // namespace ferry::store
