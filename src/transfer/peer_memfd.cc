#include "transfer/peer_memfd.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "common/fd_passing.h"
#include "common/log.h"

namespace ferry {

namespace {

using namespace memfd_wire;

// Closes the fd it holds when it goes.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  ~OwnedFd() {
    if (fd_ >= 0) close(fd_);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Waits until `sock` is ready for `events`, or `deadline` passes.
Status Await(int sock, short events, Deadline deadline, const std::string& who) {
  for (;;) {
    const auto left = std::chrono::ceil<Millis>(deadline.Remaining()).count();
    if (left <= 0) return Status::Timeout(who + " did not answer in time");
    pollfd p{sock, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r > 0) return Status::Ok();  // ready, or failed: the next call says which
    if (r < 0 && errno != EINTR) return Status::FromErrno(errno, "poll");
  }
}

void FillAddress(std::string_view name, sockaddr_un* sa, socklen_t* len) {
  *sa = {};
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// A connection to `owner`'s server, checked to be the owner's own socket.
Result<int> Dial(const SegmentDescriptor& owner, const MemfdServerAddress& at, Deadline deadline,
                 const std::string& who) {
  OwnedFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return Status::FromErrno(errno, "socket");
  // A full backlog makes connect wait; SO_SNDTIMEO bounds that wait.
  const auto left = std::chrono::ceil<std::chrono::microseconds>(deadline.Remaining()).count();
  timeval tv{static_cast<time_t>(left / 1000000), static_cast<suseconds_t>(left % 1000000)};
  if (left <= 0) return Status::Timeout(who + ": no time left to connect");
  setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_un sa;
  socklen_t len;
  FillAddress(at.name, &sa, &len);
  while (connect(sock.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN) return Status::Timeout(who + ": its socket's backlog stayed full");
    return Status::Unavailable(who +
                               ": cannot connect to its memfd socket: " + std::strerror(errno));
  }
  ucred cred{};
  socklen_t clen = sizeof(cred);
  if (getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
    return Status::FromErrno(errno, "SO_PEERCRED");
  }
  if (static_cast<uint32_t>(cred.pid) != owner.pid || cred.uid != at.uid) {
    return Status::Unavailable(
        fmt::format("{}: its memfd socket belongs to pid {} (uid {})", who, cred.pid, cred.uid));
  }
  return sock.release();
}

Status SendRequest(int sock, const MemfdRef& ref, Deadline deadline, const std::string& who) {
  uint8_t req[kRequestBytes];
  EncodeMemfdRequest(ref, req);
  size_t sent = 0;
  while (sent < sizeof(req)) {
    const ssize_t n = send(sock, req + sent, sizeof(req) - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      FERRY_RETURN_IF_ERROR(Await(sock, POLLOUT, deadline, who));
    } else {
      return Status::ConnectionLost(who + ": its memfd socket closed: " + std::strerror(errno));
    }
  }
  return Status::Ok();
}

// The reply and the fds that came with it, all of them: the caller closes them.
Status ReceiveReply(int sock, uint8_t reply[kReplyBytes], std::vector<int>* fds, Deadline deadline,
                    const std::string& who) {
  size_t got = 0;
  while (got < kReplyBytes) {
    const ssize_t n = ReceiveWithFds(sock, reply + got, kReplyBytes - got, fds);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      FERRY_RETURN_IF_ERROR(Await(sock, POLLIN, deadline, who));
      continue;
    }
    if (n < 0 && errno == EMSGSIZE) return Status::ProtocolError(who + " sent too many fds");
    if (n <= 0) return Status::ConnectionLost(who + " closed its memfd socket without a reply");
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// The one fd a valid reply carries; its file holds `ref.length` bytes at least.
Result<int> CheckReply(const uint8_t reply[kReplyBytes], const std::vector<int>& fds,
                       const MemfdRef& ref, const std::string& who) {
  ByteReader r(reply, kReplyBytes);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  const uint8_t code = r.U8();
  const uint8_t pad = r.U8();
  const uint64_t size = r.U64();
  if (magic != kMagic || version != kVersion || pad != 0 ||
      code > static_cast<uint8_t>(kLastStatusCode)) {
    return Status::ProtocolError(who + ": malformed memfd reply");
  }
  const std::string what =
      fmt::format("memfd {} (region 0x{:x}, serial {})", ref.memfd, ref.addr, ref.serial);
  if (code != 0) {
    if (!fds.empty()) return Status::ProtocolError(who + ": a refusal came with an fd");
    return Status(static_cast<StatusCode>(code), who + " refused " + what);
  }
  if (fds.size() != 1) {
    return Status::ProtocolError(fmt::format("{}: {} fds for {}", who, fds.size(), what));
  }
  struct stat st {};
  if (fstat(fds[0], &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    return Status::ProtocolError(who + ": the reply misstates the size of " + what);
  }
  if (size < ref.length) return Status::IoError(who + ": " + what + " is smaller than its region");
  return fds[0];
}

}  // namespace

std::string EncodeMemfdServer(const MemfdServerAddress& a) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(a.uid);
  w.Str(a.name);
  return std::string(out.begin(), out.end());
}

std::optional<MemfdServerAddress> DecodeMemfdServer(std::string_view blob) {
  ByteReader r(reinterpret_cast<const uint8_t*>(blob.data()), blob.size());
  MemfdServerAddress a;
  a.uid = r.U32();
  a.name = r.Str(kMaxName);
  if (!r.ok() || r.Left() != 0 || a.name.empty()) return std::nullopt;
  return a;
}

void EncodeMemfdRequest(const MemfdRef& ref, uint8_t out[kRequestBytes]) {
  std::vector<uint8_t> v;
  v.reserve(kRequestBytes);
  ByteWriter w(&v);
  w.U32(kMagic);
  w.U16(kVersion);
  w.U16(kGetMemfd);
  w.I32(ref.memfd);
  w.U32(0);
  w.U64(ref.addr);
  w.U64(ref.serial);
  std::memcpy(out, v.data(), kRequestBytes);
}

Result<MemfdRef> DecodeMemfdRequest(const uint8_t in[kRequestBytes]) {
  ByteReader r(in, kRequestBytes);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  const uint16_t type = r.U16();
  MemfdRef ref;
  ref.memfd = r.I32();
  const uint32_t pad = r.U32();
  ref.addr = r.U64();
  ref.serial = r.U64();
  if (magic != kMagic) return Status::ProtocolError("not a memfd request (wrong magic)");
  if (version != kVersion) {
    return Status::ProtocolError(
        fmt::format("memfd protocol version {}; this build speaks {}", version, kVersion));
  }
  if (type != kGetMemfd || pad != 0 || ref.memfd < 0) {
    return Status::ProtocolError("malformed memfd request");
  }
  return ref;
}

void EncodeMemfdReply(StatusCode code, uint64_t size, uint8_t out[kReplyBytes]) {
  std::vector<uint8_t> v;
  v.reserve(kReplyBytes);
  ByteWriter w(&v);
  w.U32(kMagic);
  w.U16(kVersion);
  w.U8(static_cast<uint8_t>(code));
  w.U8(0);
  w.U64(size);
  std::memcpy(out, v.data(), kReplyBytes);
}

bool MayAskForMemfds(const SegmentDescriptor& owner) {
  auto at = DecodeMemfdServer(owner.SegmentBlobOf(kMemfdServerTransport));
  return at && (at->uid == geteuid() || geteuid() == 0);
}

Result<char*> MapPeerMemfd(const SegmentDescriptor& owner, const MemfdRef& ref, Millis timeout) {
  const Deadline deadline = Deadline::After(timeout);
  const std::string who = "pid " + std::to_string(owner.pid);
  auto at = DecodeMemfdServer(owner.SegmentBlobOf(kMemfdServerTransport));
  if (!at) return Status::Unavailable(who + " serves no memfds");
  if (!MayAskForMemfds(owner)) {
    return Status::Unavailable(
        fmt::format("{} serves its memfds to uid {} and root only", who, at->uid));
  }
  FERRY_ASSIGN_OR_RETURN(int s, Dial(owner, *at, deadline, who));
  OwnedFd sock(s);
  FERRY_RETURN_IF_ERROR(SendRequest(sock.get(), ref, deadline, who));
  uint8_t reply[kReplyBytes];
  std::vector<int> fds;
  Status st = ReceiveReply(sock.get(), reply, &fds, deadline, who);
  Result<int> fd = st.ok() ? CheckReply(reply, fds, ref, who) : Result<int>(st);
  for (int f : fds) {
    if (!fd.ok() || f != fd.value()) close(f);
  }
  if (!fd.ok()) return fd.status();
  OwnedFd file(fd.value());
  // Populated here, off the data path: otherwise the first write into each
  // page of the peer's memory faults, and a put into a fresh mapping runs at
  // a fraction of memcpy speed.
  void* p =
      mmap(nullptr, ref.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, file.get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, who + ": mmap of its memfd");
  return static_cast<char*>(p);
}

}  // namespace ferry
