// A fake peer for tests of requests that stay in flight: its listener
// describes one host and one GPU region, answers the hello and counts the
// reads and writes it is sent (taking in a write's payload), answering none
// of them.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu.h"
#include "integration/peer.h"
#include "transfer/descriptor.h"
#include "transfer/frame_wire.h"

namespace ferry::test {

class SilentTarget {
 public:
  static constexpr uint64_t kHost = 0x100000, kGpu = 0x10000000, kLen = 16 << 20;

  SilentTarget() {
    lfd_ = ListenOnLoopback(&port_);
    acceptor_ = std::thread([this] {
      for (int fd; (fd = accept(lfd_, nullptr, nullptr)) >= 0;) {
        fds_.push_back(fd);
        conns_.emplace_back([this, fd] { Serve(fd); });
      }
    });
  }
  ~SilentTarget() {
    shutdown(lfd_, SHUT_RDWR);
    close(lfd_);
    acceptor_.join();
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (auto& t : conns_) t.join();
    for (int fd : fds_) close(fd);
  }
  SilentTarget(const SilentTarget&) = delete;
  SilentTarget& operator=(const SilentTarget&) = delete;

  std::string name() const { return "127.0.0.1:" + std::to_string(port_); }
  uint16_t port() const { return port_; }
  int requests() const { return requests_.load(); }
  int writes() const { return writes_.load(); }

 private:
  void Serve(int fd) {
    uint8_t in[wire::kHeaderSize], out[wire::kHeaderSize];
    while (recv(fd, in, sizeof(in), MSG_WAITALL) == static_cast<ssize_t>(sizeof(in))) {
      auto h = wire::DecodeHeader(in);
      if (!h.ok()) return;
      if (h.value().opcode == wire::Opcode::kHello) {
        wire::EncodeHeader({wire::Opcode::kHelloAck, StatusCode::kOk, h.value().id, kEpoch, 0},
                           out);
        send(fd, out, sizeof(out), MSG_NOSIGNAL);
      } else if (h.value().opcode == wire::Opcode::kGetDescriptor) {
        SegmentDescriptor d;
        d.epoch = kEpoch;
        d.host_id = "another host";
        d.pid = 1;
        d.transports = {"tcp"};
        RegionDesc host, dev;
        host.addr = kHost;
        host.length = kLen;
        host.serial = 1;
        dev.addr = kGpu;
        dev.length = kLen;
        dev.kind = static_cast<uint8_t>(gpu::MemoryKind::kDevice);
        dev.device = 0;
        dev.serial = 2;
        d.regions = {host, dev};
        auto bytes = EncodeDescriptor(d);
        wire::EncodeHeader(
            {wire::Opcode::kDescriptor, StatusCode::kOk, h.value().id, 0, bytes.size()}, out);
        send(fd, out, sizeof(out), MSG_NOSIGNAL);
        send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      } else if (h.value().opcode == wire::Opcode::kRead) {
        requests_.fetch_add(1);
      } else if (h.value().opcode == wire::Opcode::kWrite && h.value().length <= kLen) {
        std::vector<char> payload(h.value().length);
        if (recv(fd, payload.data(), payload.size(), MSG_WAITALL) !=
            static_cast<ssize_t>(payload.size())) {
          return;
        }
        writes_.fetch_add(1);
      } else {
        return;
      }
    }
  }

  static constexpr uint64_t kEpoch = 42;
  int lfd_ = -1;
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::vector<int> fds_;  // touched by the acceptor until it is joined
  std::vector<std::thread> conns_;
  std::atomic<int> requests_{0};
  std::atomic<int> writes_{0};
};

}  // namespace ferry::test
