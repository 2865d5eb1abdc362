// Payload receive for both ends of tcp: the lanes and the target. Unlike asio::async_read,
// it raises the socket's SO_RCVLOWAT while it waits, so a large payload wakes
// the thread once per PayloadRecv::lowat bytes instead of once per burst of
// segments. On loopback that cuts the receive side's syscalls several-fold.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <asio.hpp>
#include <cerrno>
#include <cstdint>

#include "common/env.h"

namespace ferry {

// How payloads are received; knobs that exist to compare, read once.
struct PayloadRecv {
  // The most SO_RCVLOWAT is raised to while a payload is awaited
  // (FERRY_TCP_RCVLOWAT_KIB, default 256 KiB; 0 never raises it).
  int lowat;
  // FERRY_TCP_INLINE_RECV_US, default 0 (off): with more than 0, the rest of
  // a payload is first awaited in a blocking recv (MSG_WAITALL) on the
  // socket's own thread, as a raw stream does, for at most this long per
  // call while bytes keep coming; then, or when none came, as without it.
  // The bytes are already on their way (a header and its payload leave in
  // one send), and meanwhile the socket is the receiver's, whose thread
  // then processes the arriving segments instead of the sender's.
  int inline_us;
};

inline const PayloadRecv& PayloadRecvTuning() {
  static const PayloadRecv t{
      static_cast<int>(env::GetIntIn("FERRY_TCP_RCVLOWAT_KIB", 0, 4096, 256)) << 10,
      static_cast<int>(env::GetIntIn("FERRY_TCP_INLINE_RECV_US", 0, 100000, 0))};
  return t;
}

inline void SetRcvLowat(int fd, int* current, int want) {
  if (*current == want) return;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) *current = want;
}

// The inline wait of PayloadRecv::inline_us: receives into *dst, advancing it
// and *left, until done, an error (returned as a negative errno; 0 is the end
// of stream) or a call that got nothing within the wait. The socket is left
// non-blocking again, as asio expects it.
inline int RecvInline(int fd, char** dst, uint64_t* left, int wait_us) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return 1;
  timeval tv{wait_us / 1000000, wait_us % 1000000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int rc = 1;
  while (*left > 0) {
    ssize_t n = ::recv(fd, *dst, *left, MSG_WAITALL);
    if (n > 0) {
      *dst += n;
      *left -= static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    rc = n == 0 ? 0 : -errno;
    break;
  }
  fcntl(fd, F_SETFL, flags);
  return rc;
}

// Reads exactly `left` bytes into `dst`, then calls handler(error_code), maybe
// inline. `lowat` caches the socket's SO_RCVLOWAT and is 1 again on return, so
// header reads are unaffected. `sock` and `lowat` must outlive the read.
template <typename Handler>
void AsyncReadPayload(asio::ip::tcp::socket& sock, char* dst, uint64_t left, int* lowat,
                      Handler handler) {
  const int fd = sock.native_handle();
  while (left > 0) {
    ssize_t n = ::recv(fd, dst, left, MSG_DONTWAIT);
    if (n > 0) {
      dst += n;
      left -= static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    asio::error_code ec = n == 0 ? asio::error_code(asio::error::eof)
                                 : asio::error_code(errno, asio::system_category());
    SetRcvLowat(fd, lowat, 1);
    return handler(ec);
  }
  if (left > 0 && PayloadRecvTuning().inline_us > 0) {
    const int rc = RecvInline(fd, &dst, &left, PayloadRecvTuning().inline_us);
    if (rc <= 0) {
      SetRcvLowat(fd, lowat, 1);
      return handler(rc == 0 ? asio::error_code(asio::error::eof)
                             : asio::error_code(-rc, asio::system_category()));
    }
  }
  if (left == 0) {
    SetRcvLowat(fd, lowat, 1);
    return handler(asio::error_code());
  }
  // Never ask for more than remains, or the last bytes would never wake us.
  SetRcvLowat(fd, lowat,
              static_cast<int>(std::clamp<uint64_t>(PayloadRecvTuning().lowat, 1, left)));
  sock.async_wait(
      asio::ip::tcp::socket::wait_read,
      [&sock, dst, left, lowat, handler = std::move(handler)](asio::error_code ec) mutable {
        if (ec) {
          SetRcvLowat(sock.native_handle(), lowat, 1);
          return handler(ec);
        }
        AsyncReadPayload(sock, dst, left, lowat, std::move(handler));
      });
}

}  // namespace ferry
