// A TCP server of framed calls (store/rpc/framing.h) with a thread per
// connection: the master's socket calls (store/rpc/master_wire.h). A blocking
// thread per connection is what keeps a call near a TCP round trip: the
// kernel wakes the one thread whose socket has the request, with no hand-off.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "ferry/status.h"
#include "store/rpc/framing.h"

namespace ferry::store {

struct SocketServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 picks a free port
  // Connections served at once; one more gets a greeting with Unavailable
  // and is closed, so that its client goes back to gRPC.
  size_t max_connections = 1024;
  // A connection with no request for this long is closed; a frame once begun
  // must arrive within frame_timeout, and a reply be taken within it.
  Millis idle_timeout{10 * 60 * 1000};
  Millis frame_timeout{5000};
};

// The reply to one request.
struct SocketReply {
  StatusCode code = StatusCode::kOk;
  std::vector<uint8_t> payload;
};

class SocketServer {
 public:
  // Runs a request on its connection's thread. `peer` is "ipv4:ADDR:PORT"
  // (or ipv6:[ADDR]:PORT), as gRPC names peers.
  using Handler =
      std::function<SocketReply(const framing::Frame& request, const std::string& peer)>;

  // Binds and listens; Unavailable when the address cannot be bound.
  // `greeting` is the type of the frame sent on accept.
  static Result<std::unique_ptr<SocketServer>> Start(const SocketServerOptions& options,
                                                     const framing::Format& format,
                                                     uint16_t greeting, Handler handler);
  // Closes the listener and every connection and joins their threads: calls
  // in their handlers must return first (the caller makes them).
  ~SocketServer();

  int port() const;
  size_t connections() const;  // being served now
  uint64_t calls() const;      // requests answered since Start

  class Impl;

 private:
  explicit SocketServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::store
