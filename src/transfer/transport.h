// The one interface every transport implements, in lifecycle order:
// capabilities, reachability, connect, post. Progress and completion happen on
// the transport's own threads, through Task::Done. A transport registers itself
// in its own .cc with FERRY_REGISTER_TRANSPORT, so adding one touches no core file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "transfer/batch.h"
#include "transfer/descriptor.h"

namespace asio {
class io_context;
}

namespace ferry {

namespace gpu {
class Copier;
}
class MemoryRegistry;
class Segment;
class ThreadPool;

// What the engine lends its transports. Outlives every transport.
struct EngineContext {
  const EngineOptions& options;
  asio::io_context& io;
  ThreadPool& copy_pool;
  const MemoryRegistry& registry;
  gpu::Copier* copier;  // null without a GPU
  ThreadPool* landing;  // lands received staging in GPU memory; null: inline
};

struct TransportCaps {
  TransportKind kind = TransportKind::kNone;
  const char* name = "";
  int priority = 0;             // lower is tried first
  uint64_t max_task_bytes = 0;  // requests are sliced to at most this
  bool host_memory = true;      // moves requests whose both sides are host memory
  bool gpu_memory = false;      // moves requests with GPU memory on a side
};

// A transport's path to one segment. Shared with in-flight work, so it may
// outlive the segment's reference to it.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  // Takes the tasks and completes each exactly once through Task::Done,
  // including on failure and shutdown. Never blocks.
  virtual void Post(std::vector<Task> tasks) = 0;
  // Fails every task still held, promptly; later posts fail at once.
  virtual void Close() = 0;
  // Stream-ordered path: the remote range as this process's GPU copies can
  // address it, and what keeps that address mapped: hold it until the copies
  // on the stream are done. Optional; NotSupported by default.
  struct Mapped {
    void* addr = nullptr;
    std::shared_ptr<const void> hold;
  };
  virtual Result<Mapped> MapForStream(uint64_t remote, uint64_t length) {
    (void)remote;
    (void)length;
    return Status(StatusCode::kNotSupported, "this transport has no stream-ordered path");
  }
  // The owner's registrations changed; `fresh` is its new descriptor, same
  // epoch. Called before any request sees `fresh`, possibly from several
  // threads at once. False: this endpoint cannot follow, and the engine
  // drops it (work in flight keeps it until done).
  virtual bool Follow(const SegmentDescriptor& fresh) {
    (void)fresh;
    return true;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const TransportCaps& caps() const = 0;
  // Pure: looks only at the segment and its descriptor.
  virtual bool CanReach(const Segment& segment) const = 0;
  // Never blocks on the network; connections are made lazily.
  virtual Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) = 0;
};

using TransportFactory = std::unique_ptr<Transport> (*)(EngineContext& ctx);

struct TransportRegistration {
  std::string name;
  TransportFactory factory;
};

bool RegisterTransport(const char* name, TransportFactory factory);
std::vector<TransportRegistration> RegisteredTransports();

}  // namespace ferry

// Registers `Class`, constructed from an EngineContext&, under `name`.
#define FERRY_REGISTER_TRANSPORT(name, Class)                                             \
  [[maybe_unused]] static const bool ferry_transport_registered_##name =                  \
      ::ferry::RegisterTransport(                                                         \
          #name, [](::ferry::EngineContext& ctx) -> std::unique_ptr<::ferry::Transport> { \
            return std::make_unique<Class>(ctx);                                          \
          })
