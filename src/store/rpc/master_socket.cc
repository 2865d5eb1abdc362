#include "store/rpc/master_socket.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "common/host.h"
#include "store/rpc/master_wire.h"

namespace ferry::store {
namespace {

// Idle connections kept, and how long one may idle before it is closed
// rather than reused (well inside the master's idle timeout, so that a
// reused one is not closed under the call).
constexpr size_t kMaxIdle = 64;
constexpr Millis kMaxIdleTime{60000};
// Longest wait for a connect and its greeting, within the call's timeout.
constexpr Millis kConnectTimeout{1000};
// After a failed connect, calls fail at once (and go by gRPC) this long.
constexpr Millis kDownFor{1000};

Status Unsent(const std::string& why) { return Status::Unavailable("master socket: " + why); }

}  // namespace

struct MasterSocket::Conn {
  int fd = -1;
  Clock::time_point used;
  ~Conn() {
    if (fd >= 0) close(fd);
  }
};

class MasterSocket::Pool {
 public:
  std::mutex mu;
  std::vector<std::unique_ptr<Conn>> idle;  // guarded by mu
  Clock::time_point down_until;             // guarded by mu
  std::atomic<uint64_t> next_id{1};
};

MasterSocket::MasterSocket(std::string host, uint16_t port, std::chrono::microseconds spin)
    : host_(std::move(host)), port_(port), spin_(spin), pool_(std::make_unique<Pool>()) {}

MasterSocket::~MasterSocket() = default;

Result<std::unique_ptr<MasterSocket::Conn>> MasterSocket::Open(Deadline deadline) {
  const std::string host = Unbracketed(host_);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(port_);
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Unsent(fmt::format("cannot resolve {}: {}", host_, gai_strerror(rc)));
  }
  auto c = std::make_unique<Conn>();
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && c->fd < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int r = connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<Millis>(deadline.Remaining()).count();
      r = poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0))) == 1 ? 0 : -1;
      int err = r == 0 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof err;
      if (r == 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      r = err == 0 ? 0 : -1;
    }
    if (r != 0) {
      why = std::strerror(errno);
      close(fd);
      continue;
    }
    c->fd = fd;
  }
  freeaddrinfo(res);
  if (c->fd < 0) return Unsent(fmt::format("cannot connect to {}:{}: {}", host_, port_, why));
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto left = std::chrono::duration_cast<Millis>(deadline.Remaining());
  auto hello = framing::Receive(master_wire::kFormat, c->fd, deadline, std::max(left, Millis(1)));
  if (!hello.ok()) return Unsent("no greeting: " + hello.status().message());
  if (hello.value().type != static_cast<uint16_t>(master_wire::Type::kGreeting)) {
    return Unsent("the master's first frame is not a greeting");
  }
  if (hello.value().code != StatusCode::kOk) {
    return Unsent("refused: " + master_wire::ReplyMessage(hello.value().payload));
  }
  return c;
}

Result<std::unique_ptr<MasterSocket::Conn>> MasterSocket::Take(Deadline deadline) {
  {
    std::lock_guard lk(pool_->mu);
    while (!pool_->idle.empty()) {
      std::unique_ptr<Conn> c = std::move(pool_->idle.back());
      pool_->idle.pop_back();
      // An idle connection has nothing to read: readable means closed (or
      // out of step), and it is dropped.
      pollfd p{c->fd, POLLIN | POLLRDHUP, 0};
      if (Clock::now() - c->used < kMaxIdleTime && poll(&p, 1, 0) == 0) return c;
    }
    if (Clock::now() < pool_->down_until) return Unsent("down after a failed connect");
  }
  auto c = Open(Deadline(std::min(deadline.at(), Clock::now() + kConnectTimeout)));
  if (!c.ok()) {
    std::lock_guard lk(pool_->mu);
    pool_->down_until = Clock::now() + kDownFor;
  }
  return c;
}

void MasterSocket::Give(std::unique_ptr<Conn> c) {
  c->used = Clock::now();
  std::lock_guard lk(pool_->mu);
  if (pool_->idle.size() < kMaxIdle) pool_->idle.push_back(std::move(c));
}

Result<framing::Frame> MasterSocket::Call(uint16_t type, std::span<const uint8_t> payload,
                                          Millis timeout, bool* unsent) {
  *unsent = false;
  const Deadline deadline = Deadline::After(timeout);
  auto c = Take(deadline);
  if (!c.ok()) {
    *unsent = true;
    return c.status();
  }
  const uint64_t id = pool_->next_id.fetch_add(1);
  const auto ms =
      static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 1, master_wire::kMaxDeadlineMs));
  if (Status sent = framing::Send(master_wire::kFormat, c.value()->fd, type, id, ms,
                                  StatusCode::kOk, payload, deadline);
      !sent.ok()) {
    if (sent.code() == StatusCode::kInvalidArgument) {  // over the bound: nothing left
      *unsent = true;
      return sent;
    }
    return Status(sent.code() == StatusCode::kTimeout ? sent.code() : StatusCode::kUnavailable,
                  "master socket: " + sent.message());
  }
  auto reply = framing::Receive(
      master_wire::kFormat, c.value()->fd, deadline,
      std::max(std::chrono::duration_cast<Millis>(deadline.Remaining()), Millis(1)), spin_);
  if (!reply.ok()) {
    const Status& st = reply.status();
    if (st.code() == StatusCode::kTimeout) return st;
    return Status(st.code() == StatusCode::kProtocolError ? st.code() : StatusCode::kUnavailable,
                  "master socket: " + st.message());
  }
  if (reply.value().type != type || reply.value().id != id) {
    return Status::ProtocolError("master socket: a reply to another request");
  }
  Give(std::move(c).value());
  return reply;
}

}  // namespace ferry::store
