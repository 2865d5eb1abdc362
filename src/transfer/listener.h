// The engine's listener: one TCP port that serves both the p2p metadata
// (Hello, GetDescriptor) and the tcp transport's data frames (Write, Read).
// Every frame is validated; every remote range is checked against the
// registry. A malformed frame closes that connection and is logged, and the
// listener keeps serving everyone else.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"

namespace asio {
class io_context;
}

namespace ferry {

class MemoryRegistry;

class Listener {
 public:
  struct Config {
    std::string host;
    uint16_t port = 0;
    uint64_t epoch = 0;
    // Bound on receiving one frame's payload once its header arrived.
    Millis frame_timeout{30000};
    // Connections beyond this are closed at once; env FERRY_MAX_CONNECTIONS.
    size_t max_connections = 1024;
  };
  using DescriptorFn = std::function<std::vector<uint8_t>()>;

  // Binds and starts accepting. Unavailable if the address cannot be bound.
  static Result<std::unique_ptr<Listener>> Start(asio::io_context& io, const Config& config,
                                                 const MemoryRegistry& registry,
                                                 DescriptorFn descriptor);
  virtual ~Listener() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting and closes every connection; handlers finish on the io threads.
  virtual void Stop() = 0;
};

}  // namespace ferry
