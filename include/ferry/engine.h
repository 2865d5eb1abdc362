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
#include "ferry/types.h"

namespace ferry {

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
  // "p2p": descriptors are fetched from each peer's listener.
  // "etcd://host:port[,host:port]/CLUSTER": the engine publishes its
  // descriptor in etcd under /ferry/CLUSTER/engines/<name>, bound to a lease
  // of metadata_ttl that it keeps alive (a killed engine's entry goes within
  // it), and peers read it from there: OpenSegment needs no reachable
  // listener, and a peer whose entry went is NotFound. docs/cluster.md.
  std::string metadata = "p2p";
  // etcd metadata: the lease's TTL; env FERRY_METADATA_TTL_S (1..3600).
  std::chrono::seconds metadata_ttl{10};
  // Empty (or auto) picks the best transport per request. Otherwise the
  // registered name of a transport that moves host memory between processes
  // (tcp or shm), which then serves every host-memory request, to this
  // engine's own segment too; one that moves GPU memory itself (tcp, with a
  // GPU) serves GPU requests as well. A forced transport that reaches any
  // host is also the only one this engine offers its peers. Env
  // FERRY_TRANSPORT applies when this is empty.
  std::string transport;
  // Connections per peer; env FERRY_TCP_LANES. 0: 8 on 16 cores or more,
  // 2 below 4 cores, else 4 (EffectiveTcpLanes; docs/performance.md has the
  // measurements).
  int tcp_lanes = 0;
  // Of those, how many carry requests that touch GPU memory at the target;
  // env FERRY_TCP_GPU_LANES. Fewer than tcp_lanes: such requests get lanes of
  // their own, as many as this. 8, all of the default lanes on 16 cores: with
  // landing_threads 0, writes into GPU memory at the target moved 39% more
  // than on 4 lanes with a landing pool on an H100 (docs/performance.md).
  // Requests whose GPU memory is only here are staged here and take the host
  // lanes.
  int tcp_gpu_lanes = 8;
  uint64_t tcp_chunk_bytes = 512 << 10;  // slice size over TCP; env FERRY_TCP_CHUNK_BYTES
  // The slice size of requests with GPU memory at either end, and the size
  // of the staging buffers at both ends; env FERRY_TCP_GPU_CHUNK_BYTES. Each
  // such chunk costs a GPU copy of its own: with GPU memory here only, 1 MiB
  // moved writes 1-18% more than 512 KiB on four H100s, where host memory was
  // even (docs/performance.md). A checksummed write into GPU memory at a
  // peer whose value is smaller is refused (docs/engine.md).
  uint64_t tcp_gpu_chunk_bytes = 1 << 20;
  // Chunks each lane keeps on the wire; env FERRY_TCP_INFLIGHT. 0: 2 where a
  // peer's lanes share one chunk queue (more than one io thread), so a
  // batch's chunks wait there for whichever lane frees first instead of
  // being dealt out at once; else 4. Small chunks get as many as
  // FERRY_TCP_WINDOW_KIB holds where that is more (with a shared queue,
  // half a lane's share of the batch from 256 to 512 KiB, else 1 MiB; 16 at
  // most); requests to GPU memory at the target
  // twice this (8 for 0). docs/performance.md has the measurements.
  int tcp_chunks_in_flight = 0;
  // tcp with a GPU: pinned buffers of tcp_gpu_chunk_bytes each that stage
  // GPU memory here, per peer, made with its first request over tcp; env
  // FERRY_TCP_STAGING_BUFFERS (0 to 4096). 0: two windows of GPU requests for
  // each lane (tcp_lanes x 16 at the defaults, 128 MiB a peer on 8 lanes).
  // Reads into GPU memory here use at most one window a lane. Fewer holds
  // less memory and moves less (docs/gpu.md).
  int tcp_staging_buffers = 0;
  // tcp: every write and read payload carries a CRC-32C, checked at the
  // other end, so bytes corrupted in flight fail their request with
  // ProtocolError instead of landing. Env FERRY_TCP_CHECKSUM (0 or 1).
  // docs/performance.md has its cost; targets check flagged frames always.
  bool tcp_checksum = false;
  // Network threads; env FERRY_IO_THREADS. 0: as DefaultIoThreads
  // chooses, so lanes move data in parallel where cores allow.
  int io_threads = 0;
  // Every io thread on one shared io_context, the engine's model before
  // 2026-12-01, kept to compare against; by default each io thread polls
  // its own sockets (docs/performance.md). Env FERRY_IO_SHARED (0 or 1).
  bool io_shared = false;
  // How long a network thread with nothing ready keeps polling its sockets
  // before it sleeps, so a reply or payload arriving meanwhile costs it no
  // wake-up; env FERRY_IO_SPIN_US (0 to 10000; 0 sleeps at once). -1: as
  // EffectiveIoSpinUs chooses, 50 µs unless the io threads are half the
  // cores or more (below 4 cores: more than half).
  int io_spin_us = -1;
  // Where the io threads run; env FERRY_IO_CPUS. "auto": each on a CPU of
  // its own where the process may use 8 CPUs or more, claimed host-wide so
  // that the engines of one host take different ones (none pinned when too
  // few are free); "off": where the scheduler puts them; a list such as
  // "0-7,12": thread i on the i-th CPU of it. On the H200 machine's 16
  // cores "auto" moved tcp 8-18% more; on the 2-core VM pinning moved
  // nothing clear.
  std::string io_cpus = "auto";
  // shm and local copy threads; env FERRY_COPY_THREADS. 0: 2, or 4 on 16
  // cores or more, where a third and fourth thread lifted shm writes into
  // fresh memory by two thirds (docs/performance.md).
  int copy_threads = 0;
  // Threads that start the GPU copies of tcp staging at a target (landing
  // what a socket received, or filling a reply); env FERRY_LANDING_THREADS.
  // 0: none, the socket thread that received a write lands it, demoting its
  // own lines, which on 8 GPU lanes beat a pool (docs/performance.md).
  // -1: one per 4 cores, from 2 up to tcp_gpu_lanes. A read into GPU memory
  // here lands on the socket thread that received it (FERRY_READ_LANDING=0:
  // on these threads, where there are any).
  int landing_threads = 0;
  // RegisterMemory makes host memory present and writable before it returns,
  // so no transfer into it pays a page fault per 4 KiB (up to half the
  // machine's memory; the bytes are unchanged). Env FERRY_POPULATE_REGISTERED
  // (0 or 1).
  bool populate_registered = true;
  std::chrono::milliseconds request_timeout{30000};  // default deadline of a request
  std::chrono::milliseconds connect_timeout{5000};   // connects and descriptor fetches
  // A file holding the cluster secret (mode 0600 or stricter; trailing
  // newlines ignored). Peers of this engine's listener must prove it before
  // anything is served, and this engine proves it to the peers it opens;
  // the secret itself never crosses the wire. Empty: env FERRY_AUTH_KEY_FILE;
  // neither set: no authentication. docs/wire-protocol.md has the handshake.
  std::string auth_key_file;
};

// Counts since Engine::Create, for monitoring and tests.
struct EngineStats {
  // Peers the listener refused for not proving the cluster secret: none, a
  // wrong one, a replayed handshake, or a request before the handshake.
  uint64_t auth_failures = 0;
};

class BatchState;

// A submitted batch. Nothing leaks if it is never polled.
class Batch {
 public:
  explicit Batch(std::shared_ptr<BatchState> state);
  // Cancels the requests that have not started, then blocks until no engine
  // thread touches the batch's buffers, which must stay valid until then.
  // Transports fail the tasks they hold at their deadline, so this returns
  // at the latest 5 s after the last deadline of its requests (the submit's
  // timeout, or request_timeout); should a transport still hold one then, it
  // logs an error and returns anyway. Copies already enqueued on a caller's
  // stream (SubmitOnStream) belong to that stream: synchronize it before
  // reusing their buffers.
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // The number of requests.
  size_t size() const;
  // The counts so far. Never blocks.
  BatchStatus Poll() const;
  // Blocks until every request is done or `timeout` passes. Returns OK when all
  // succeeded, Timeout if still running (the batch goes on), else the first error.
  Status Wait(std::chrono::milliseconds timeout);
  // Request `index`: done is false while it runs; once done, status is its
  // outcome and transport the registered name of what moved it (kNoTransport
  // when it failed before one was chosen). An index past the batch reads as
  // done with OutOfRange. Never blocks.
  RequestResult Result(size_t index) const;

 private:
  std::shared_ptr<BatchState> state_;
};

// Where these defaults say cores, an engine counts the CPUs its process may
// run on at once (its CPU affinity: taskset, a container's cpuset); for
// polling, the CPU time it may spend: fewer CPUs where a cgroup CPU quota
// (docker --cpus, a Kubernetes CPU limit) allows less. A container given 2
// CPUs of a 64-core host gets the defaults of 2 cores, or with a quota of 2,
// the threads of 64 cores that do not poll.

// The lanes an engine opens per peer for `tcp_lanes` (EngineOptions) on
// `cores` (this process's, where not given): 0 is 8 on 16 cores or more, 2
// below 4 cores, else 4; any other value is itself.
int EffectiveTcpLanes(int tcp_lanes, int cores);
int EffectiveTcpLanes(int tcp_lanes);

// The polling of an engine's io threads for `io_spin_us` (EngineOptions) on
// `cores`: -1 is 50 µs, or 0 where `io_threads` are half the cores or more
// on 4 cores or more, or more than half below 4; any other value is itself.
int EffectiveIoSpinUs(int io_spin_us, int io_threads, int cores);

// The io threads an engine starts for io_threads 0 (EngineOptions), with
// `lanes` tcp lanes a peer on `cores`: one per 2 cores, from 1 up to the
// lanes; below 4 cores, one per core.
int DefaultIoThreads(int cores, int lanes);

class Engine {
 public:
  // Starts the listener and the engine's threads. Unavailable if the address
  // cannot be bound; InvalidArgument for a malformed host, tcp options out of
  // range, a transport that cannot be forced (EngineOptions::transport) or a
  // malformed FERRY_* environment variable (named in the message), or a key
  // file (auth_key_file, FERRY_AUTH_KEY_FILE) that is missing, empty, too
  // short or readable by group or others, or a malformed etcd:// metadata
  // string; NotSupported for an unknown metadata mode; with etcd metadata,
  // Unavailable (naming the endpoints) or Timeout when etcd does not answer
  // within connect_timeout per endpoint.
  static Result<std::unique_ptr<Engine>> Create(EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // "host:port": the name peers pass to OpenSegment.
  const std::string& name() const;
  uint64_t epoch() const;
  // The counters so far. Never blocks.
  EngineStats Stats() const;
  // The options in force: the FERRY_* environment applied, and the defaults
  // tcp_lanes, io_threads, io_spin_us and copy_threads resolved to what this
  // engine chose for the CPUs it may use.
  const EngineOptions& options() const;

  // Exposes [addr, addr+length) to peers. AlreadyExists if it overlaps a
  // registered range, InvalidArgument for null or zero length. The memory stays
  // owned by the caller and must outlive the registration. Host or GPU memory
  // is told apart here, once. With etcd metadata, this and the three calls
  // below also republish the descriptor, blocking up to connect_timeout per
  // etcd endpoint; if etcd fails, that is retried in the background.
  Status RegisterMemory(void* addr, size_t length);
  // Withdraws a registration: requests checked after the call fail with
  // OutOfRange; those already under way may still touch the memory. NotFound
  // unless `addr` starts a registration, InvalidArgument for memory from
  // AllocateMemory (FreeMemory frees it).
  Status UnregisterMemory(void* addr);
  // Allocates and registers memfd-backed memory, which same-host peers map once
  // and copy with memcpy; page-locked for GPU copies where a GPU exists. Owned
  // by the engine until FreeMemory or destruction. InvalidArgument for zero
  // bytes, IoError when the memory cannot be had.
  Result<void*> AllocateMemory(size_t length);
  // Withdraws and unmaps memory from AllocateMemory, at once: the caller makes
  // sure no request to it, its own or a peer's, is under way. NotFound unless
  // `addr` starts such an allocation, InvalidArgument for memory registered
  // with RegisterMemory (UnregisterMemory withdraws it).
  Status FreeMemory(void* addr);

  // Resolves "host:port", fetching and caching the peer's descriptor (from
  // etcd, with etcd metadata: NotFound when no such engine is published);
  // blocks up to connect_timeout. InvalidArgument for a malformed name,
  // Unavailable when nobody listens (or etcd does not answer), Timeout when
  // the peer does not answer in time, ProtocolError for a malformed descriptor or one of another
  // Ferry version, Unauthenticated when the peer and this engine do not hold the same cluster
  // secret (a request to such a peer fails the same way). The engine's own name gives a local
  // segment. Each call opens a new one.
  Result<SegmentId> OpenSegment(std::string_view name);
  // The cached descriptor, refreshed first if the peer's epoch was seen to
  // change. NotFound for a segment not open.
  Result<SegmentInfo> GetSegmentInfo(SegmentId segment);
  // Forgets the segment. Its requests that a transport still holds fail
  // promptly with Cancelled (a copy under way completes); its batches stay
  // valid; later submits naming it fail with NotFound. NotFound for a
  // segment not open.
  Status CloseSegment(SegmentId segment);

  // Validates and posts the requests; never waits for data. InvalidArgument
  // (null local, zero length, empty batch) or NotFound (unknown segment) reject
  // the whole batch before anything moves. Per-request failures, such as an
  // out-of-range remote address, are reported through the Batch. A request
  // that fails leaves its destination (a read's local buffer, a write's
  // remote range) unspecified: some of its bytes may have landed. None land
  // from a range refused (OutOfRange, before any byte moves), nor, over tcp
  // with tcp_checksum, from a write chunk that did not arrive whole and
  // intact (the target applies a chunk only once it has checked it). `timeout` is
  // each request's deadline, covering queueing and payload progress; zero means
  // request_timeout. The requests of a batch, and of concurrent batches, run in
  // no set order: ranges written by one must not overlap ranges another touches.
  Result<std::unique_ptr<Batch>> Submit(std::span<const Request> requests,
                                        std::chrono::milliseconds timeout = {});
  // The same, with a submission stream for GPU memory. GPU memory moves within
  // this engine's own segment (local), to and from same-host peers (cuda_ipc),
  // and over tcp, where each end stages its own GPU memory through pinned
  // buffers. A request whose GPU memory no transport can move fails through
  // the Batch with NotSupported. Never blocks on the GPU: readiness is an
  // event recorded on `options.stream`, waited on by the engine's private
  // streams; the CUDA error when it cannot be recorded rejects the batch.
  Result<std::unique_ptr<Batch>> Submit(std::span<const Request> requests,
                                        const SubmitOptions& options);
  // Stream-ordered transfer (DESIGN.md R5): returns at once. The copies start
  // after all work enqueued on `stream` (a cudaStream_t; null is the legacy
  // default stream) before the call, and work enqueued on it afterwards sees
  // the data; synchronizing the stream implies completion. Errors also reach
  // the returned Batch. Every copy is enqueued on `stream` itself, so it works
  // with every kind of stream and under lazy module loading. A mapping moves
  // GPU memory on this host by copies on the stream alone (local, cuda_ipc);
  // otherwise the CPU moves the bytes (tcp, shm, or host memory on both
  // sides) between a signal and a wait on the stream, with this side's GPU
  // memory staged by copies on it and the target's staged by the target.
  // Every request is checked before anything is enqueued, and any error
  // rejects the whole call: those Submit reports for the batch or for one
  // request, and NotSupported without a GPU, for a stream being captured
  // into a graph, or for GPU memory at a peer that neither maps nor stages it.
  Result<std::unique_ptr<Batch>> SubmitOnStream(std::span<const Request> requests, void* stream);

  // Submits one request and waits for it: the submit's error, the request's
  // outcome, or Timeout when it is not done 5 s past its deadline.
  Status Transfer(const Request& request, std::chrono::milliseconds timeout = {});

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
