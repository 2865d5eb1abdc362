#include "store/rpc/attach_wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/bytes.h"
#include "common/fd_passing.h"

namespace ferry::store::attach {
namespace {

// Waits for `events` on `sock` until `deadline`: OK, Timeout or an error.
Status Wait(int sock, short events, Deadline deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<Millis>(deadline.Remaining()).count();
    if (left <= 0 && deadline.Expired()) {
      return Status::Timeout("the attach socket's deadline passed");
    }
    pollfd p{sock, events, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(std::max<int64_t>(left, 1), 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "poll");
    if (r == 0) continue;  // the loop head decides whether the deadline passed
    if (p.revents & (POLLERR | POLLNVAL)) {
      return Status::ConnectionLost("the attach socket failed");
    }
    return Status::Ok();  // readable, writable or hung up: the next call says which
  }
}

Status Lost(int err) {
  return Status::ConnectionLost(err == 0 ? std::string("the peer closed the attach socket")
                                         : std::string("attach socket: ") + std::strerror(err));
}

void CloseFds(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// Reads exactly `n` bytes, collecting any passed fds into `fds`; until
// `spin_until` it tries again instead of waiting in poll.
Status ReadAll(int sock, uint8_t* dst, size_t n, Deadline deadline, std::vector<int>* fds,
               Clock::time_point spin_until = {}) {
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
    if (r == 0) return Lost(0);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Lost(errno);
    if (Clock::now() < std::min(spin_until, deadline.at())) {
      std::this_thread::yield();
      continue;
    }
    FERRY_RETURN_IF_ERROR(Wait(sock, POLLIN, deadline));
  }
  return Status::Ok();
}

}  // namespace

Status Send(int sock, Type type, uint64_t id, uint32_t deadline_ms, StatusCode code,
            std::span<const uint8_t> payload, Deadline deadline, int fd) {
  if (payload.size() > kMaxPayload) {
    return Status::InvalidArgument("attach request of " + std::to_string(payload.size()) +
                                   " bytes; at most " + std::to_string(kMaxPayload));
  }
  std::vector<uint8_t> head;
  head.reserve(kHeaderBytes);
  ByteWriter w(&head);
  w.U32(kMagic);
  w.U16(kVersion);
  w.U16(static_cast<uint16_t>(type));
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
      FERRY_RETURN_IF_ERROR(Wait(sock, POLLOUT, deadline));
      continue;
    }
    return Lost(r < 0 ? errno : 0);
  }
  return Status::Ok();
}

Result<Frame> Receive(int sock, Deadline first_byte, Millis rest, std::chrono::microseconds spin) {
  uint8_t head[kHeaderBytes];
  std::vector<int> fds;
  // The first byte may be long in coming; the rest of the frame may not.
  Status st = ReadAll(sock, head, 1, first_byte, &fds,
                      spin.count() > 0 ? Clock::now() + spin : Clock::time_point{});
  const Deadline body = Deadline::After(rest);
  if (st.ok()) st = ReadAll(sock, head + 1, kHeaderBytes - 1, body, &fds);
  Frame f;
  uint32_t length = 0;
  if (st.ok()) {
    ByteReader r(head, kHeaderBytes);
    const uint32_t magic = r.U32();
    const uint16_t version = r.U16();
    const uint16_t type = r.U16();
    f.id = r.U64();
    length = r.U32();
    f.deadline_ms = r.U32();
    const uint8_t code = r.U8();
    const uint8_t pad = r.U8();
    const uint16_t pad2 = r.U16();
    if (magic != kMagic) {
      st = Status::ProtocolError("not an attach frame (wrong magic)");
    } else if (version != kVersion) {
      st = Status::ProtocolError("attach protocol version " + std::to_string(version) +
                                 "; this build speaks " + std::to_string(kVersion));
    } else if (type < 1 || type > kLastType) {
      st = Status::ProtocolError("unknown attach message type " + std::to_string(type));
    } else if (length > kMaxPayload) {
      st = Status::ProtocolError("attach frame of " + std::to_string(length) + " bytes; at most " +
                                 std::to_string(kMaxPayload));
    } else if (code > static_cast<uint8_t>(kLastStatusCode) || pad != 0 || pad2 != 0 ||
               f.deadline_ms > kMaxDeadlineMs) {
      st = Status::ProtocolError("malformed attach frame header");
    }
    f.type = static_cast<Type>(type);
    f.code = static_cast<StatusCode>(code);
  }
  if (st.ok()) {
    f.payload.resize(length);
    st = ReadAll(sock, f.payload.data(), length, body, &fds);
  }
  if (st.ok() && fds.size() > 1) {
    st = Status::ProtocolError("more than one file descriptor in one frame");
  }
  if (!st.ok()) {
    CloseFds(fds);
    return st;
  }
  if (!fds.empty()) f.fd = fds[0];
  return f;
}

std::vector<uint8_t> MessagePayload(const Status& st) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Str(st.message().substr(0, kMaxMessage));
  return out;
}

Status ReplyStatus(const Frame& reply) {
  if (reply.code == StatusCode::kOk) return Status::Ok();
  ByteReader r(reply.payload.data(), reply.payload.size());
  std::string msg = r.Str(kMaxMessage);
  if (!r.ok()) msg = "(no message)";
  return Status(reply.code, "node: " + msg);
}

auth::Mac NodeProof(const auth::Key& key, std::string_view client, std::string_view node) {
  return key.Sign("ferry attach v1 node", {auth::AsField(client), auth::AsField(node)});
}

auth::Mac ClientProof(const auth::Key& key, std::string_view client, std::string_view node) {
  return key.Sign("ferry attach v1 client", {auth::AsField(client), auth::AsField(node)});
}

}  // namespace ferry::store::attach
