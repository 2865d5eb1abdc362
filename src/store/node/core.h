// The store's operations on top of an engine and a master: what an embedded
// Store runs in the application, and what a node runs for the applications
// attached to it. Puts write every replica through the engine (or by memcpy
// into `node`'s own memory) and commit at the master; gets read one replica
// under a read lease and end the lease off the caller's path. Thread safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/engine.h"
#include "ferry/store.h"
#include "store/node/reserve_pool.h"
#include "store/rpc/master_client.h"

namespace ferry::store {

class StoreNode;
struct LocalCopy;

// A run of bytes in this process (read-only for a put).
struct Part {
  uint8_t* data = nullptr;
  size_t size = 0;
};
size_t TotalSize(std::span<const Part> parts);

// A value to put: the concatenation of its parts.
struct Source {
  std::vector<Part> parts;
  static Source Of(const void* data, size_t size) {
    return {{Part{static_cast<uint8_t*>(const_cast<void*>(data)), size}}};
  }
};

// A region that values are packed into, one after another, as they arrive.
struct Pack {
  uint8_t* base = nullptr;
  size_t cap = 0;
  size_t used = 0;
};

// Where a get puts a value: a vector sized on arrival, caller memory filled
// part by part (OutOfRange when their sum is too small), or the next free
// bytes of `pack` (then `parts` is set to them; OutOfRange when too few).
struct Sink {
  std::vector<uint8_t>* vec = nullptr;
  std::vector<Part> parts;
  Pack* pack = nullptr;
  size_t size = 0;  // set by Get to the value's size whenever the key was found
};

struct CoreOptions {
  uint32_t replicas = 1;                    // when PutOptions::replicas is 0
  bool prefer_local = true;                 // first copy in `node` when it fits
  std::chrono::milliseconds read_delay{0};  // fault injection: lookup-to-read pause
  // Space reserved ahead of puts (reserve_pool.h), at most this many bytes;
  // 0 begins every put at the master.
  uint64_t reserve_bytes = 256ull << 20;
};

class StoreCore {
 public:
  // `engine`, `client` and `node` (null: none in this process) outlive the core.
  StoreCore(Engine& engine, MasterClient& client, StoreNode* node, CoreOptions options);
  // Sends the leases still to end, then stops.
  ~StoreCore();
  StoreCore(const StoreCore&) = delete;
  StoreCore& operator=(const StoreCore&) = delete;

  // One result per key, in order. `pre` may arrive with items already failed;
  // those are skipped. Sources need not be registered: host memory is copied
  // by memcpy into local replicas, and by the engine to remote ones; GPU
  // memory only by the engine, after the work enqueued on options.stream (R1).
  // With `own_stream`, options.stream is instead a private stream of the
  // caller's that already waits for the producer (an attach session's):
  // copies between GPU memory and this node's memory are enqueued on it and
  // waited for directly, with no hand-off to the engine's threads.
  std::vector<Status> Put(std::span<const std::string> keys, std::span<const Source> values,
                          const PutOptions& options, std::vector<Status> pre = {},
                          bool own_stream = false);
  // Sizes of the values read into `sinks` (one per key).
  // GPU memory among the sinks is written after the work enqueued on
  // `stream` (R2), and has arrived when Get returns.
  // With `expect`, a value that does not begin with those bytes fails
  // (InvalidArgument) before any byte reaches its sink.
  // `own_stream`: as for Put.
  std::vector<Result<size_t>> Get(std::span<const std::string> keys, std::span<Sink> sinks,
                                  void* stream = nullptr, std::string_view expect = {},
                                  bool own_stream = false);
  std::vector<Status> Exists(std::span<const std::string> keys);
  std::vector<Status> Remove(std::span<const std::string> keys, bool force);
  std::vector<Status> Pin(std::span<const std::string> keys, StorePin pin,
                          std::chrono::milliseconds ttl);
  std::vector<Result<ObjectLocation>> Locate(std::span<const std::string> keys);
  Result<StoreStats> Stats() { return client_.Stats(); }
  Result<uint64_t> RemoveAll(bool force) {
    FlushReleases();  // this core's finished reads no longer hold their keys
    return client_.RemoveAll(force);
  }

  // Memory the engine may move straight to and from (RegisterMemory), and
  // that Registered then accepts. GPU memory is copied by the engine only.
  Status Register(void* data, size_t size);
  Status Unregister(void* data);
  bool Registered(std::span<const Part> parts);

  Engine& engine() { return engine_; }

 private:
  // Put, with reservations from the pool when `reserve`; the indices of
  // items whose reservation the master no longer knew go to `retry`.
  std::vector<Status> PutPass(std::span<const std::string> keys, std::span<const Source> values,
                              const PutOptions& options, std::vector<Status> pre, bool own_stream,
                              bool reserve, std::vector<size_t>* retry);
  Result<SegmentId> Segment(const std::string& name);
  // Whether `e`, of `rep`, is this process's node memory, of this epoch.
  bool Local(const StoreReplica& rep, const StoreExtent& e) const;
  // The first `n` bytes of a replica, from this node's memory or read by the engine.
  Status ReadPrefix(const StoreReplica& rep, size_t n, Deadline deadline, std::string* out);
  // Copies to and from `node_`'s memory: inline, or (large) as requests on
  // the engine's own segment appended to `reqs`, each owned by its item.
  // With `own` (a private stream, see Put), the GPU ones are enqueued on it
  // and waited for; the status returned is theirs, for every copy's owner.
  Status CopyLocal(std::span<const LocalCopy> copies, Op op, void* own, std::vector<Request>* reqs,
                   std::vector<size_t>* owner);
  // Whether `mine`, the own side of a copy, is GPU memory: registered as
  // such, or a client's that this node imported.
  bool IsGpu(const uint8_t* mine, size_t length);
  // Whether any of `copies`' own-side memory is GPU memory.
  bool AnyGpu(std::span<const LocalCopy> copies, Op op);
  void QueueReleases(std::vector<std::pair<std::string, uint64_t>> leases);
  void FlushReleases();
  void ReleaseLoop();

  Engine& engine_;
  MasterClient& client_;
  StoreNode* const node_;
  const CoreOptions options_;

  std::mutex seg_mu_;
  std::unordered_map<std::string, SegmentId> segments_;  // guarded by seg_mu_
  std::mutex buf_mu_;
  struct Range {
    uint64_t size = 0;
    bool gpu = false;
  };
  std::map<uint64_t, Range> buffers_;                // registered ranges; guarded by buf_mu_
  const Range* Find(const void* p, size_t n) const;  // requires buf_mu_

  // Leases of finished gets are ended by a background thread, off the get's
  // path; a remove sends the pending ones first.
  std::mutex rel_mu_;
  std::condition_variable rel_cv_;
  std::vector<std::pair<std::string, uint64_t>> rel_queue_;  // guarded by rel_mu_
  bool rel_stop_ = false;                                    // guarded by rel_mu_
  std::mutex rel_send_mu_;  // held while sending, so a flush waits for a send in flight
  std::thread rel_thread_;

  std::unique_ptr<ReservePool> pool_;  // null with reserve_bytes 0
};

}  // namespace ferry::store
