// A raw client of an engine's listener, for frames no engine would send:
// malformed ones, ones out of order, and recorded ones sent again.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "common/clock.h"
#include "transfer/frame_wire.h"

namespace ferry::test {

class RawClient {
 public:
  // From `from`, another loopback address, where given: another source.
  explicit RawClient(uint16_t port, const char* from = nullptr) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (from != nullptr) {
      inet_pton(AF_INET, from, &a.sin_addr);
      if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return;
    }
    a.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  void Send(const void* p, size_t n) { ASSERT_EQ(send(fd_, p, n, MSG_NOSIGNAL), ssize_t(n)); }
  void SendHeader(wire::Opcode op, uint64_t addr, uint64_t len) {
    uint8_t h[wire::kHeaderSize];
    wire::EncodeHeader({op, StatusCode::kOk, 77, addr, len}, h);
    Send(h, sizeof(h));
  }
  // Exactly `n` bytes; false when the peer closed first or `timeout` passed
  // (then timed_out() says so).
  bool Read(void* p, size_t n, Millis timeout = Millis(5000)) {
    auto* out = static_cast<uint8_t*>(p);
    size_t got = 0;
    Deadline d = Deadline::After(timeout);
    while (got < n) {
      pollfd pfd{fd_, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) {
        if (d.Expired()) {
          timed_out_ = true;
          return false;
        }
        continue;
      }
      ssize_t r = recv(fd_, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  // What one receive returns once bytes are there (up to `n`); 0 when the
  // peer closed or `timeout` passed.
  size_t ReadSome(void* p, size_t n, Millis timeout = Millis(5000)) {
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(timeout.count())) <= 0) return 0;
    const ssize_t r = recv(fd_, p, n, 0);
    return r > 0 ? static_cast<size_t>(r) : 0;
  }
  // A reply header, or nullopt when the peer closed the connection in time.
  std::optional<wire::Header> ReadHeader(Millis timeout = Millis(5000)) {
    uint8_t h[wire::kHeaderSize];
    if (!Read(h, sizeof(h), timeout)) return std::nullopt;
    auto r = wire::DecodeHeader(h);
    if (!r.ok()) return std::nullopt;
    return r.value();
  }
  bool timed_out() const { return timed_out_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool timed_out_ = false;
};

}  // namespace ferry::test
