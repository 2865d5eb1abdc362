#include "store/rpc/framing.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "common/bytes.h"
#include "common/cpu_quota.h"
#include "common/env.h"
#include "common/fd_passing.h"

namespace ferry::store::framing {
namespace {

// The payload's memory grows by at most this much ahead of the bytes read.
constexpr size_t kGrowStep = size_t{1} << 20;

// Waits for `events` on `sock` until `deadline`: OK, Timeout or an error.
Status Wait(const Format& f, int sock, short events, Deadline deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<Millis>(deadline.Remaining()).count();
    if (left <= 0 && deadline.Expired()) {
      return Status::Timeout(fmt::format("the {} socket's deadline passed", f.name));
    }
    pollfd p{sock, events, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(std::max<int64_t>(left, 1), 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "poll");
    if (r == 0) continue;  // the loop head decides whether the deadline passed
    if (p.revents & (POLLERR | POLLNVAL)) {
      return Status::ConnectionLost(fmt::format("the {} socket failed", f.name));
    }
    return Status::Ok();  // readable, writable or hung up: the next call says which
  }
}

Status Lost(const Format& f, int err) {
  return Status::ConnectionLost(err == 0
                                    ? fmt::format("the peer closed the {} socket", f.name)
                                    : fmt::format("{} socket: {}", f.name, std::strerror(err)));
}

void CloseFds(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// Reads exactly `n` bytes, collecting any passed fds into `fds`; until
// `spin_until` it tries again instead of waiting in poll.
Status ReadAll(const Format& f, int sock, uint8_t* dst, size_t n, Deadline deadline,
               std::vector<int>* fds, Clock::time_point spin_until = {}) {
  while (n > 0) {
    ssize_t r = ReceiveWithFds(sock, dst, n, fds);
    if (r < 0 && errno == EMSGSIZE) {
      return Status::ProtocolError("too many file descriptors in one frame");
    }
    if (r > 0) {
      dst += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Lost(f, 0);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Lost(f, errno);
    if (Clock::now() < std::min(spin_until, deadline.at())) {
      std::this_thread::yield();
      continue;
    }
    FERRY_RETURN_IF_ERROR(Wait(f, sock, POLLIN, deadline));
  }
  return Status::Ok();
}

}  // namespace

Status Send(const Format& f, int sock, uint16_t type, uint64_t id, uint32_t deadline_ms,
            StatusCode code, std::span<const uint8_t> payload, Deadline deadline, int fd) {
  if (payload.size() > f.max_payload) {
    return Status::InvalidArgument(
        fmt::format("{} message of {} bytes; at most {}", f.name, payload.size(), f.max_payload));
  }
  std::vector<uint8_t> head;
  head.reserve(kHeaderBytes);
  ByteWriter w(&head);
  w.U32(f.magic);
  w.U16(f.version);
  w.U16(type);
  w.U64(id);
  w.U32(static_cast<uint32_t>(payload.size()));
  w.U32(deadline_ms);
  w.U8(static_cast<uint8_t>(code));
  w.U8(0);
  w.U16(0);
  iovec iov[2] = {{head.data(), head.size()},
                  {const_cast<uint8_t*>(payload.data()), payload.size()}};
  size_t skip = 0;  // bytes already sent
  const size_t total = head.size() + payload.size();
  bool fd_sent = fd < 0;
  while (skip < total) {
    iovec cur[2];
    int n = 0;
    size_t s = skip;
    for (const iovec& v : iov) {
      if (s >= v.iov_len) {
        s -= v.iov_len;
        continue;
      }
      cur[n++] = {static_cast<uint8_t*>(v.iov_base) + s, v.iov_len - s};
      s = 0;
    }
    ssize_t r = SendWithFd(sock, cur, static_cast<size_t>(n), fd_sent ? -1 : fd);
    if (r > 0) {
      skip += static_cast<size_t>(r);
      fd_sent = true;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      FERRY_RETURN_IF_ERROR(Wait(f, sock, POLLOUT, deadline));
      continue;
    }
    return Lost(f, r < 0 ? errno : 0);
  }
  return Status::Ok();
}

Result<Frame> Receive(const Format& f, int sock, Deadline first_byte, Millis rest,
                      std::chrono::microseconds spin) {
  uint8_t head[kHeaderBytes];
  std::vector<int> fds;
  // The first byte may be long in coming; the rest of the frame may not.
  Status st = ReadAll(f, sock, head, 1, first_byte, &fds,
                      spin.count() > 0 ? Clock::now() + spin : Clock::time_point{});
  const Deadline body = Deadline::After(rest);
  if (st.ok()) st = ReadAll(f, sock, head + 1, kHeaderBytes - 1, body, &fds);
  Frame out;
  uint32_t length = 0;
  if (st.ok()) {
    ByteReader r(head, kHeaderBytes);
    const uint32_t magic = r.U32();
    const uint16_t version = r.U16();
    out.type = r.U16();
    out.id = r.U64();
    length = r.U32();
    out.deadline_ms = r.U32();
    const uint8_t code = r.U8();
    const uint8_t pad = r.U8();
    const uint16_t pad2 = r.U16();
    if (magic != f.magic) {
      st = Status::ProtocolError(
          fmt::format("not a frame of the {} protocol (wrong magic)", f.name));
    } else if (version != f.version) {
      st = Status::ProtocolError(
          fmt::format("{} protocol version {}; this build speaks {}", f.name, version, f.version));
    } else if (out.type < 1 || out.type > f.last_type) {
      st = Status::ProtocolError(fmt::format("unknown {} message type {}", f.name, out.type));
    } else if (length > f.max_payload) {
      st = Status::ProtocolError(
          fmt::format("{} frame of {} bytes; at most {}", f.name, length, f.max_payload));
    } else if (code > static_cast<uint8_t>(kLastStatusCode) || pad != 0 || pad2 != 0 ||
               out.deadline_ms > f.max_deadline_ms) {
      st = Status::ProtocolError(fmt::format("malformed {} frame header", f.name));
    }
    out.code = static_cast<StatusCode>(code);
  }
  for (size_t got = 0; st.ok() && got < length;) {
    const size_t step = std::min<size_t>(length - got, kGrowStep);
    out.payload.resize(got + step);
    st = ReadAll(f, sock, out.payload.data() + got, step, body, &fds);
    got += step;
  }
  if (st.ok() && fds.size() > 1) {
    st = Status::ProtocolError("more than one file descriptor in one frame");
  }
  if (!st.ok()) {
    CloseFds(fds);
    return st;
  }
  if (!fds.empty()) out.fd = fds[0];
  return out;
}

std::chrono::microseconds ReplySpin(const char* env) {
  return std::chrono::microseconds(env::GetIntIn(env, 0, 10000, cpus::Budget() >= 8 ? 2000 : 0));
}

}  // namespace ferry::store::framing
