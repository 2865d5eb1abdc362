// Payload receive for both ends of tcp: the lanes and the target. Unlike asio::async_read,
// it raises the socket's SO_RCVLOWAT while it waits, so a large payload wakes
// the thread once per PayloadLowat() bytes instead of once per burst of
// segments. On loopback that cuts the receive side's syscalls several-fold.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <asio.hpp>
#include <cerrno>
#include <cstdint>

#include "transfer/frame_service.h"

namespace ferry {

inline void SetRcvLowat(int fd, RcvLowat* lowat, int want) {
  if (lowat->current == want) return;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) lowat->current = want;
}

// Reads exactly `left` bytes into `dst`, then calls handler(error_code), maybe
// inline. While it waits, the socket's SO_RCVLOWAT is raised to `lowat`'s
// ceiling (at most what remains); it is 1 again on return, so header reads
// are unaffected. `sock` and `lowat` must outlive the read.
//
// With a `tail`, the receive that ends the payload also takes what has come
// after it, up to the tail's room: a stream of frames then costs one receive
// each instead of two (payload, then the next header). `tail` must outlive
// the read.
//
// `progress(n)` runs after each receive that brought `n` more payload bytes.
struct NoProgress {
  void operator()(uint64_t) const {}
};

template <typename Handler, typename Progress = NoProgress>
void AsyncReadPayload(asio::ip::tcp::socket& sock, char* dst, uint64_t left, RcvLowat* lowat,
                      Handler handler, ReceiveTail* tail = nullptr, Progress progress = {}) {
  const int fd = sock.native_handle();
  while (left > 0) {
    ssize_t n;
    if (tail != nullptr && tail->got < tail->cap) {
      // The kernel fills the payload first: the tail gets only what follows it.
      iovec iov[2] = {{dst, left}, {tail->buf + tail->got, tail->cap - tail->got}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
    } else {
      n = ::recv(fd, dst, left, MSG_DONTWAIT);
    }
    if (n > 0) {
      const uint64_t took = std::min<uint64_t>(static_cast<uint64_t>(n), left);
      dst += took;
      left -= took;
      if (tail != nullptr) tail->got += static_cast<size_t>(n) - took;
      progress(took);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    asio::error_code ec = n == 0 ? asio::error_code(asio::error::eof)
                                 : asio::error_code(errno, asio::system_category());
    SetRcvLowat(fd, lowat, 1);
    return handler(ec);
  }
  if (left == 0) {
    SetRcvLowat(fd, lowat, 1);
    return handler(asio::error_code());
  }
  // Never ask for more than remains, or the last bytes would never wake us.
  SetRcvLowat(
      fd, lowat,
      static_cast<int>(std::clamp<uint64_t>(static_cast<uint64_t>(lowat->ceiling), 1, left)));
  sock.async_wait(asio::ip::tcp::socket::wait_read,
                  [&sock, dst, left, lowat, tail, handler = std::move(handler),
                   progress = std::move(progress)](asio::error_code ec) mutable {
                    if (ec) {
                      SetRcvLowat(sock.native_handle(), lowat, 1);
                      return handler(ec);
                    }
                    AsyncReadPayload(sock, dst, left, lowat, std::move(handler), tail,
                                     std::move(progress));
                  });
}

}  // namespace ferry
