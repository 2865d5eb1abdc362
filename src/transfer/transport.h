// The one interface every transport implements, in lifecycle order:
// options, capabilities, offering, reachability, registration, connect, post.
// Progress and completion happen on the transport's own threads, through
// Task::Done. A transport lives in its own folder and registers itself there
// with FERRY_REGISTER_TRANSPORT, so adding one touches no core file: the
// engine knows transports only by their registered name and their caps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/auth.h"
#include "ferry/status.h"
#include "transfer/batch.h"
#include "transfer/descriptor.h"

namespace asio {
class io_context;
}

namespace ferry {

namespace gpu {
class Copier;
struct MemoryInfo;
}  // namespace gpu
struct EngineOptions;
class FrameService;
class IoPool;
class MemoryRegistry;
struct Region;
class Segment;
class ThreadPool;

// What the engine lends its transports. Outlives every transport.
struct EngineContext {
  const EngineOptions& options;
  IoPool& io;  // a lane's socket goes on io.Next()
  ThreadPool& copy_pool;
  const MemoryRegistry& registry;
  gpu::Copier* copier;  // null without a GPU
  // The cluster secret that peers' listeners ask this engine to prove; null: none.
  std::shared_ptr<const auth::Key> key = nullptr;
};

// Which peers a transport's endpoints can reach.
enum class Reach : uint8_t {
  kProcess,  // this engine's own segment only; never offered to peers
  kHost,     // engines on this host
  kNetwork,  // any engine whose listener it can connect to
};

// The stream-ordered path a transport offers (Engine::SubmitOnStream).
enum class StreamPath : uint8_t {
  // The CPU moves the bytes, between a signal and a wait on the caller's
  // stream (stream_relay.h).
  kRelayed,
  // Endpoint::MapForStream gives an address through which the copies are
  // enqueued on the caller's stream itself.
  kMapped,
};

// A transport's capabilities, as data: the engine selects and plans by these,
// never by name.
struct TransportCaps {
  const char* name = "";        // the registered name; static storage
  int priority = 0;             // lower is tried first
  uint64_t max_task_bytes = 0;  // requests are sliced to at most this
  // Requests with GPU memory at either end are sliced to at most this
  // instead; 0: max_task_bytes.
  uint64_t max_gpu_task_bytes = 0;
  bool host_memory = true;  // moves requests whose both sides are host memory
  bool gpu_memory = false;  // moves requests with GPU memory on a side
  Reach reach = Reach::kHost;
  StreamPath stream_path = StreamPath::kRelayed;
  // GPU memory at the target moves as plain bytes that the target stages,
  // so a relayed stream-ordered transfer may reach it.
  bool target_stages_gpu = false;
  // False when this process lacks what the transport needs (a GPU, say):
  // it is then neither offered nor routed to.
  bool available = true;
  // Threads this transport's sockets want on the engine's io_context; the
  // engine runs as many as the most demanding transport asks, 1 at least,
  // unless EngineOptions::io_threads says otherwise.
  int io_threads = 0;
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
  // StreamPath::kMapped: the remote range as this process's GPU copies can
  // address it, and what keeps that address mapped: hold it until the copies
  // on the stream are done. NotSupported by default.
  struct Mapped {
    void* addr = nullptr;
    std::shared_ptr<const void> hold;
  };
  virtual Result<Mapped> MapForStream(uint64_t remote, uint64_t length) {
    (void)remote;
    (void)length;
    return Status::NotSupported("this transport has no stream-ordered path");
  }
  // The owner's registrations changed; `fresh` is its new descriptor, same
  // epoch. Called before any request sees `fresh`, possibly from several
  // threads at once. False: this endpoint cannot follow, and the engine
  // drops it (work in flight keeps it until done).
  virtual bool Follow(const SegmentDescriptor& fresh) {
    (void)fresh;
    return true;
  }
  // Sets up ahead of the first request what requests would otherwise set up
  // on first use (the shm transport maps the peer's buffers), so none pays
  // for it. Called when the segment is opened; may block briefly on
  // same-host sockets, never on the network. Best effort: what fails here is
  // tried again, and reported, by the request that needs it. Optional.
  virtual void Warm() {}
};

class Transport {
 public:
  virtual ~Transport() = default;

  // 0. Options: InvalidArgument, naming the option, when one this transport
  // reads is out of range; the engine then fails to start. Called once, on
  // every transport made, before anything else. Optional.
  virtual Status CheckOptions() const { return Status::Ok(); }

  // 1. Capabilities; fixed once the transport is made.
  virtual const TransportCaps& caps() const = 0;

  // 2. The engine offers this transport to its peers (lists it in its
  // descriptor): prepare what they need to reach this process. Called once,
  // at engine start, before any descriptor is served. Optional.
  virtual Status Offer() { return Status::Ok(); }

  // What peers' endpoints need from this engine as a whole, in the
  // transport's own format; the descriptor carries it as an opaque blob
  // (SegmentDescriptor::SegmentBlobOf). Called for offered transports each
  // time the descriptor is built, so it must be cheap. At most
  // kMaxSegmentBlob bytes. Optional.
  virtual std::string DescribeSegment() { return {}; }

  // 3. Reachability. Pure: looks only at the segment and its descriptor.
  virtual bool CanReach(const Segment& segment) const = 0;

  // 4. Registration: what peers' endpoints need to reach `region` through
  // this transport, in the transport's own format. The descriptor carries it
  // as an opaque blob (SegmentDescriptor::BlobOf); empty when there is
  // nothing to say. Called once per registration, for offered transports
  // only, so it may export handles (R4: never on a data path). At most
  // kMaxRegionBlob bytes. Optional.
  virtual std::string DescribeMemory(const Region& region, const gpu::MemoryInfo& info) {
    (void)region;
    (void)info;
    return {};
  }

  // 5. Connect. Never blocks on the network; connections are made lazily.
  virtual Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) = 0;

  // The target side: frames this transport serves on the engine's listener
  // (listener.h). Null by default: the transport needs nothing served.
  virtual FrameService* frame_service() { return nullptr; }

  // 6. Stop: the engine's io threads have ended. Finish and end the threads
  // of the transport's own, before the listener and the peers go; nothing
  // but destruction follows. Optional.
  virtual void Stop() {}

  // Keeps the transport's helper threads (not the engine's io threads) on
  // any of `cpus`, the io threads' own (FERRY_HELPER_CPUS).
  virtual Status ConfineHelpers(const std::vector<int>& /*cpus*/) { return Status::Ok(); }
};

using TransportFactory = std::unique_ptr<Transport> (*)(EngineContext& ctx);

struct TransportRegistration {
  const char* name;
  TransportFactory factory;
};

// Called by FERRY_REGISTER_TRANSPORT, from static initializers.
bool RegisterTransport(const char* name, TransportFactory factory);
// Every registration, in no set order.
std::vector<TransportRegistration> RegisteredTransports();

}  // namespace ferry

// Registers `Class` under `Class::kName` (a static constexpr char array,
// which its caps().name must point at). Class is constructed from an
// EngineContext&. Use once, in the transport's own .cc.
#define FERRY_REGISTER_TRANSPORT(Class)                                                          \
  [[maybe_unused]] static const bool ferry_transport_registered_##Class =                        \
      ::ferry::RegisterTransport(                                                                \
          Class::kName, [](::ferry::EngineContext& ctx) -> std::unique_ptr<::ferry::Transport> { \
            return std::make_unique<Class>(ctx);                                                 \
          })
