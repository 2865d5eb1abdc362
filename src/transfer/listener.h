// The engine's listener: one TCP port that serves both the p2p metadata
// (Hello, GetDescriptor) and the tcp transport's data frames (Write, Read).
// Every frame is validated; every remote range is checked against the
// registry. A malformed frame closes that connection and is logged, and the
// listener keeps serving everyone else.
//
// GPU memory of this process is staged: a write's payload lands in a pinned
// buffer and is copied to the device on a private stream before the ack (R3);
// a read is copied device-to-host first, then sent. Without a GPU such
// frames are refused with NotSupported.
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
class ThreadPool;
namespace gpu {
class Copier;
}

class Listener {
 public:
  // Replies a connection may have pending before it reads no further frame.
  static constexpr size_t kMaxQueuedReplies = 8;

  struct Config {
    std::string host;
    uint16_t port = 0;
    uint64_t epoch = 0;
    // Bound on receiving one frame's payload once its header arrived.
    Millis frame_timeout{30000};
    // Connections beyond this are closed at once; env FERRY_MAX_CONNECTIONS.
    size_t max_connections = 1024;
    // Pinned staging for GPU memory, made at start when there is a GPU. A
    // connection holds at most kMaxQueuedReplies of them.
    size_t staging_buffers = 16;
    size_t staging_bytes = 512 << 10;
    // Where the copies of staging start: received staging landed in GPU
    // memory (LandStaged), GPU memory staged for a reply. Null: on the
    // socket's thread. Must outlive the threads running the listener's
    // io_context.
    ThreadPool* landing = nullptr;
  };
  using DescriptorFn = std::function<std::vector<uint8_t>()>;

  // Binds and starts accepting. Unavailable if the address cannot be bound.
  // `copier` is null without a GPU; it must outlive the listener.
  static Result<std::unique_ptr<Listener>> Start(asio::io_context& io, const Config& config,
                                                 const MemoryRegistry& registry,
                                                 gpu::Copier* copier, DescriptorFn descriptor);
  virtual ~Listener() = default;
  virtual uint16_t port() const = 0;
  // Stops accepting and closes every connection; handlers finish on the io threads.
  virtual void Stop() = 0;
};

}  // namespace ferry
