// The engine's listener: one TCP port that accepts peers, reads and validates
// every frame header, and serves the p2p metadata (Hello, GetDescriptor). A
// frame of any other opcode goes to the transport service that claims it
// (frame_service.h), such as the tcp transport's target side. A malformed
// frame, or one no service claims, closes that connection and is logged, and
// the listener keeps serving everyone else. Connections are capped in all and
// per source address, and one that sends nothing is closed after the
// handshake timeout, so sockets left idle cannot lock real peers out.
//
// With a cluster secret (Config::key) a connection must complete the
// handshake of frame_wire.h first: until then no Write, Read or
// GetDescriptor is served. A peer that fails it is told Unauthenticated
// where its frame has a reply, closed, counted and logged (at most a line
// a second).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "ferry/status.h"

namespace asio {
class io_context;
}

namespace ferry {

class FrameService;

class Listener {
 public:
  struct Config {
    std::string host;
    uint16_t port = 0;
    uint64_t epoch = 0;
    // Bound on a frame's progress once its header arrived.
    Millis frame_timeout{30000};
    // A connection whose first frame (a Hello, or a descriptor fetch) has not
    // arrived by then is closed: it holds a slot without being a peer.
    Millis handshake_timeout{5000};
    // Connections beyond this are closed at once; env FERRY_MAX_CONNECTIONS.
    size_t max_connections = 1024;
    // The same from any one source address, so that one host cannot take
    // every slot; env FERRY_MAX_CONNECTIONS_PER_SOURCE.
    size_t max_connections_per_source = 256;
    // Peers must prove this secret; null: none do. Without one, a host that
    // is not loopback is bound with a warning.
    std::shared_ptr<const auth::Key> key;
    // The most a payload's receive raises SO_RCVLOWAT to (RcvLowat); 0: never.
    int rcv_lowat_ceiling = 0;
    // Where an accepted connection's socket goes; empty: the acceptor's io.
    std::function<asio::io_context&()> place;
  };
  using DescriptorFn = std::function<std::vector<uint8_t>()>;

  // Binds and starts accepting. Unavailable if the address cannot be bound,
  // InvalidArgument for a malformed host. `services` must outlive the
  // threads running `io`.
  static Result<std::unique_ptr<Listener>> Start(asio::io_context& io, const Config& config,
                                                 DescriptorFn descriptor,
                                                 std::vector<FrameService*> services);
  virtual ~Listener() = default;
  virtual uint16_t port() const = 0;
  // Peers refused by the handshake since Start: no proof, a wrong one, a
  // replayed one, or a frame before it. Never blocks.
  virtual uint64_t auth_failures() const = 0;
  // Stops accepting and closes every connection; handlers finish on the io threads.
  virtual void Stop() = 0;
};

}  // namespace ferry
