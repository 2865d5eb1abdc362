// The transfer engine: one-sided, batched reads and writes between the
// registered memory of any two processes.
//
// A segment is a process's set of registered buffers, named "host:port" after
// the engine's listener. A request names a remote virtual address inside one of
// the target's registered buffers. Requests are submitted as a batch, then
// polled or waited on; a batch can be freed at any time.
//
// Thread safety: every Engine method may be called from any thread. A Batch is
// used by one thread at a time. Batches must be freed before their engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

enum class Op : uint8_t { kRead = 0, kWrite = 1 };

// The transport that moved a request. Tests and benchmarks check it.
enum class TransportKind : uint8_t { kNone = 0, kLocal = 1, kShm = 2, kTcp = 3, kCudaIpc = 4 };
std::string_view TransportName(TransportKind kind);

using SegmentId = uint64_t;

struct Request {
  Op op = Op::kRead;
  void* local = nullptr;  // host memory of this process; need not be registered
  SegmentId segment = 0;  // from Engine::OpenSegment
  uint64_t remote = 0;    // virtual address inside the target's registered memory
  uint64_t length = 0;    // bytes, > 0
};

// How a submit orders itself against the caller's GPU work (DESIGN.md R1-R3).
// Ignored for batches that touch no GPU memory.
struct SubmitOptions {
  // Each request's deadline; zero means EngineOptions::request_timeout.
  std::chrono::milliseconds timeout{0};
  // The submission stream, a cudaStream_t. The transfer touches GPU memory
  // only after the work enqueued on it before the call; null is the legacy
  // default stream, which also covers every blocking stream.
  void* stream = nullptr;
  // The caller guarantees the buffers are ready: no event is recorded.
  bool already_ready = false;
};

struct EngineOptions {
  // Address to listen on and to advertise in the segment name.
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 picks a free port
  // "p2p": descriptors are fetched from each peer's listener. Nothing else yet.
  std::string metadata = "p2p";
  // "" picks the best transport per peer; "tcp" or "shm" forces one for remote
  // segments. Env FERRY_TRANSPORT applies when this is empty.
  std::string transport;
  int tcp_lanes = 4;                     // connections per peer; env FERRY_TCP_LANES
  uint64_t tcp_chunk_bytes = 512 << 10;  // slice size over TCP; env FERRY_TCP_CHUNK_BYTES
  int tcp_chunks_in_flight = 4;          // per lane; env FERRY_TCP_INFLIGHT
  // Network threads; env FERRY_IO_THREADS. 0: one per 4 cores, at most
  // tcp_lanes, so lanes move data in parallel where cores allow.
  int io_threads = 0;
  int copy_threads = 2;  // shm and local copy threads; env FERRY_COPY_THREADS
  // Threads that start the GPU copies of tcp staging (landing what a socket
  // received; at a target, also filling a reply), so socket threads read on;
  // env FERRY_LANDING_THREADS. 0: on the socket threads. -1: one per 4 cores,
  // from 2 up to tcp_lanes.
  int landing_threads = -1;
  std::chrono::milliseconds request_timeout{30000};  // default deadline of a request
  std::chrono::milliseconds connect_timeout{5000};   // connects and descriptor fetches
};

struct BufferInfo {
  uint64_t addr = 0;
  uint64_t length = 0;
  bool memfd = false;  // engine-allocated: same-host peers map it and memcpy
};

struct SegmentInfo {
  std::string name;
  uint64_t epoch = 0;  // changes when the peer process restarts
  bool same_host = false;
  std::vector<BufferInfo> buffers;  // sorted by address
};

struct BatchStatus {
  size_t total = 0;
  size_t succeeded = 0;
  size_t failed = 0;
  Status first_error;  // OK unless failed > 0
  bool done() const { return succeeded + failed == total; }
};

struct RequestResult {
  bool done = false;
  Status status;  // meaningful once done
  TransportKind transport = TransportKind::kNone;
};

class BatchState;

// A submitted batch. Destroying it cancels the requests that have not started
// and returns only once no engine thread touches the batch's buffers; until
// then the local buffers must stay valid. Nothing leaks if it is never polled.
class Batch {
 public:
  explicit Batch(std::shared_ptr<BatchState> state);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  size_t size() const;
  // Never blocks.
  BatchStatus Poll() const;
  // Blocks until every request is done or `timeout` passes. Returns OK when all
  // succeeded, Timeout if still running (the batch goes on), else the first error.
  Status Wait(std::chrono::milliseconds timeout);
  RequestResult Result(size_t index) const;

 private:
  std::shared_ptr<BatchState> state_;
};

class Engine {
 public:
  // Starts the listener and the engine's threads. Fails with Unavailable if the
  // address cannot be bound and NotSupported for an unknown metadata mode.
  static Result<std::unique_ptr<Engine>> Create(EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // "host:port": the name peers pass to OpenSegment.
  const std::string& name() const;
  uint64_t epoch() const;

  // Exposes [addr, addr+length) to peers. AlreadyExists if it overlaps a
  // registered range, InvalidArgument for null or zero length. The memory stays
  // owned by the caller and must outlive the registration. Host or GPU memory
  // is told apart here, once.
  Status RegisterMemory(void* addr, size_t length);
  // NotFound unless `addr` starts a registration made by RegisterMemory.
  Status UnregisterMemory(void* addr);
  // Allocates and registers memfd-backed memory, which same-host peers map once
  // and copy with memcpy; page-locked for GPU copies where a GPU exists. Owned
  // by the engine until FreeMemory or destruction.
  Result<void*> AllocateMemory(size_t length);
  Status FreeMemory(void* addr);

  // Resolves "host:port", fetching and caching the peer's descriptor; blocks up
  // to connect_timeout. InvalidArgument for a malformed name, Unavailable when
  // nobody answers. The engine's own name gives a local segment.
  Result<SegmentId> OpenSegment(std::string_view name);
  // The cached descriptor, refreshed first if the peer's epoch was seen to change.
  Result<SegmentInfo> GetSegmentInfo(SegmentId segment);
  Status CloseSegment(SegmentId segment);

  // Validates and posts the requests; never waits for data. InvalidArgument
  // (null local, zero length, empty batch) or NotFound (unknown segment) reject
  // the whole batch before anything moves. Per-request failures, such as an
  // out-of-range remote address, are reported through the Batch. `timeout` is
  // each request's deadline, covering queueing and payload progress; zero means
  // request_timeout. The requests of a batch, and of concurrent batches, run in
  // no set order: ranges written by one must not overlap ranges another touches.
  Result<std::unique_ptr<Batch>> Submit(std::span<const Request> requests,
                                        std::chrono::milliseconds timeout = {});
  // The same, with a submission stream for GPU memory. GPU memory moves within
  // this engine's own segment (local), to same-host peers (cuda_ipc), and from
  // this side over tcp through pinned staging; GPU memory at a tcp target fails
  // with NotSupported for now. Never blocks on the GPU: readiness is an event
  // recorded on `options.stream`, waited on by the engine's private streams.
  Result<std::unique_ptr<Batch>> Submit(std::span<const Request> requests,
                                        const SubmitOptions& options);
  // Stream-ordered transfer (DESIGN.md R5): returns at once. The copies start
  // after all work enqueued on `stream` (a cudaStream_t; null is the legacy
  // default stream) before the call, and work enqueued on it afterwards sees
  // the data; synchronizing the stream implies completion. Errors also reach
  // the returned Batch. Every copy is enqueued on `stream` itself, so it works
  // with every kind of stream and under lazy module loading. For now it serves
  // GPU memory on the same host (local and cuda_ipc paths); anything else, or
  // a stream being captured into a graph, fails with NotSupported before
  // anything is enqueued.
  Result<std::unique_ptr<Batch>> SubmitOnStream(std::span<const Request> requests, void* stream);

  // Submits one request and waits for it.
  Status Transfer(const Request& request, std::chrono::milliseconds timeout = {});

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
