// The client side of the master's socket calls (master_wire.h): connections
// to one master, opened as calls need them and reused, one call in flight on
// each. Thread safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/clock.h"
#include "ferry/status.h"
#include "store/rpc/framing.h"

namespace ferry::store {

class MasterSocket {
 public:
  // `host` as in the master's gRPC address (a name, an IPv4 literal or a
  // bracketed IPv6 one). `spin`: how long a caller looks for its reply
  // before it sleeps in poll.
  MasterSocket(std::string host, uint16_t port, std::chrono::microseconds spin);
  ~MasterSocket();

  // Sends a request of `type` and waits for its reply until `timeout` has
  // passed. The reply's code is the call's; ProtocolError for a reply that
  // does not answer the request. When no connection could be had (none
  // opens, or the master refuses one for having too many) the call fails
  // with Unavailable and `*unsent` is set: the request never left, so the
  // caller may send it another way. After a failed connect, calls fail so
  // at once for a second rather than each waiting for a connect.
  Result<framing::Frame> Call(uint16_t type, std::span<const uint8_t> payload, Millis timeout,
                              bool* unsent);

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

 private:
  struct Conn;
  Result<std::unique_ptr<Conn>> Take(Deadline deadline);
  Result<std::unique_ptr<Conn>> Open(Deadline deadline);
  void Give(std::unique_ptr<Conn> c);

  const std::string host_;
  const uint16_t port_;
  const std::chrono::microseconds spin_;
  class Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace ferry::store
