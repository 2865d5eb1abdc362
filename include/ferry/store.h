// ferry::Store: a distributed key-value store for KV cache in host memory.
//
// Values live in memory that store nodes contribute; a master holds the
// metadata and picks where each value goes. By default a Store embeds a node in
// this process (StoreOptions::local_memory) and, with no master address, also
// runs the master here: a single-process store that needs no set-up. With a
// master address it joins a cluster of `ferry master` and `ferry node`
// processes, and its own memory (if any) becomes one more node.
//
// A put allocates at the master, writes every replica through the transfer
// engine, then commits: a value is visible complete or not at all. A get
// fetches the locations with a read lease and reads one replica: a replica in
// this process by memcpy, others through the engine. A read that outlives its
// lease fails with Timeout instead of returning bytes that may have been
// reused; once its reads are done a get ends its leases. Every network call
// has a deadline.
//
// Attached (Store::Attach): the application runs no engine and opens no TCP
// port. It talks to the `ferry node --socket PATH` of its host over a Unix
// socket, and the node moves the bytes. Memory from AllocateBuffer is shared
// with the node once (a memfd) and moved with no copy; any other memory goes
// through a staging area shared with the node (one copy). When the node goes
// away the call fails with ConnectionLost; the next call attaches again.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/engine.h"
#include "ferry/status.h"

namespace ferry {

enum class StorePin : uint8_t {
  kNone = 0,
  kSoft = 1,  // not evicted in the background until its TTL ends; last resort under pressure
  kHard = 2,  // never evicted
};

// Where an object's bytes are: each replica's extents, in order, hold the value.
struct StoreExtent {
  std::string segment;  // the node's engine name, "host:port"
  uint64_t addr = 0;    // virtual address in that node's memory
  uint64_t length = 0;
};
struct StoreReplica {
  std::vector<StoreExtent> extents;
  // The engine epoch of the node process whose addresses these are; a node
  // that restarted has another, and its old addresses are refused.
  uint64_t epoch = 0;
};
struct ObjectLocation {
  uint64_t size = 0;
  std::vector<StoreReplica> replicas;
  std::chrono::milliseconds lease{0};  // granted by the lookup
};

struct PutOptions {
  uint32_t replicas = 0;          // copies on distinct nodes; 0: StoreOptions::replicas
  std::string preferred_segment;  // a node ("host:port") for the first copy, if it fits
  StorePin pin = StorePin::kNone;
  std::chrono::milliseconds pin_ttl{0};  // for kSoft
  // Registered GPU memory is read after the work enqueued on this cudaStream_t
  // before the call (DESIGN.md R1); null is the legacy default stream.
  void* stream = nullptr;
};

struct GetOptions {
  // Registered GPU memory is written after the work enqueued on this
  // cudaStream_t before the call (R2), and holds the value when the call
  // returns (R3); null is the legacy default stream.
  void* stream = nullptr;
  // When set (at most 4096 bytes), a value that does not begin with these
  // bytes fails with InvalidArgument ("... does not begin with the
  // expected bytes") before any byte reaches the buffers: a
  // reader that knows the header it needs reads straight into its tensor.
  std::string expect_prefix;
};

// Attached only: how a call makes sure GPU memory is ready before the node
// touches it (DESIGN.md R1, R2). Either way an event is recorded on the
// caller's stream, and the call returns once the node has moved the bytes.
enum class AttachReadiness : uint8_t {
  // The calling thread waits for the event, then sends, and the node's copy
  // waits for nothing. The default: the call returns only once the node has
  // the bytes either way, and on the H200 this form was the faster one
  // (docs/store.md).
  kSynchronize = 0,
  // The node's stream waits for the event on the GPU (an interprocess
  // event); neither CPU waits for the caller's GPU work before sending.
  kGpuEvent = 1,
};

struct StoreOptions {
  // "host:port" of a `ferry master`; empty starts a master in this process.
  std::string master;
  // Bytes this process contributes as an embedded node; 0 makes a pure client.
  uint64_t local_memory = 256ull << 20;
  uint32_t replicas = 1;     // default copies per value
  bool prefer_local = true;  // first copy in this process when it fits
  EngineOptions engine;
  std::chrono::milliseconds rpc_timeout{5000};  // deadline of each master call
  std::chrono::milliseconds heartbeat{1000};    // embedded node's heartbeat period
  // The in-process master's settings (used only when `master` is empty).
  std::chrono::milliseconds lease{5000};
  std::chrono::milliseconds put_timeout{10000};
  std::chrono::milliseconds node_ttl{5000};
  // At most this many bytes of space reserved at the master ahead of puts,
  // for the value sizes recent puts used: such a put skips a round trip to
  // the master. Held while reserved (stats count it as used), ended after
  // half the put timeout unused, and never made by evicting. 0: none.
  uint64_t reserve_bytes = 256ull << 20;
  // Attached only: bytes of the staging area shared with the node, which bounds
  // the values a Put/Get of memory outside AllocateBuffer can move at once.
  uint64_t attach_staging = 64ull << 20;
  AttachReadiness attach_readiness = AttachReadiness::kSynchronize;
  // The cluster secret's file (mode 0600), shared by the deployment: proven
  // on every master call, to every node's engine (and to the engine here,
  // unless engine.auth_key_file names another), and, attached, to the node.
  // The in-process master, if any, requires it. Empty: env
  // FERRY_AUTH_KEY_FILE; neither: no authentication.
  std::string auth_key_file;
};

// A caller's buffer for PutFrom/GetInto.
struct StoreBuffer {
  void* data = nullptr;
  size_t size = 0;
};

// Memory from Store::AllocateBuffer: memfd-backed, mapped in this process.
// The mapping lives as long as the last shared_ptr to it, even past the
// Store; the Store's registration of it ends at UnregisterBuffer(data()) or
// when the Store is destroyed.
class StoreMemory {
 public:
  StoreMemory(int fd, void* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  ~StoreMemory();  // unmaps and closes the memfd
  StoreMemory(const StoreMemory&) = delete;
  StoreMemory& operator=(const StoreMemory&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  // A memfd of `size` bytes, mapped and with its pages populated.
  static Result<std::shared_ptr<StoreMemory>> Create(size_t size);

 private:
  int fd_;
  void* data_;
  size_t size_;
};

// What the master knows of the whole store.
struct StoreStats {
  uint64_t capacity = 0;  // bytes contributed by mounted nodes
  uint64_t used = 0;      // bytes allocated to objects (complete or being written)
  uint64_t nodes = 0;
  uint64_t objects = 0;  // complete or being written
  uint64_t term = 0;     // the master's fencing term; 0 without elections
  // Objects the master rebuilt from the catalog of the last node to mount,
  // and from every mount since it started.
  uint64_t recovered = 0, recovered_total = 0;
  // The master that answered, host:port: with master etcd://..., the leader.
  std::string leader;
};

class Store {
 public:
  // Keys are 1 to kMaxKeyBytes bytes.
  static constexpr size_t kMaxKeyBytes = 1024;

  // Starts the engine, the in-process master if needed, and the embedded node,
  // which must mount before this returns. Unavailable if the master cannot be
  // reached within rpc_timeout; Unauthenticated if it refuses this process's
  // secret (or its lack of one); InvalidArgument for a bad key file.
  static Result<std::unique_ptr<Store>> Create(StoreOptions options);
  // Attaches to the `ferry node --socket` listening at `socket_path`. Uses
  // options.rpc_timeout (the deadline of each call), attach_staging and
  // auth_key_file; the rest is the node's. Unavailable if nothing listens
  // there or the node refuses this process (its uid), with the node's
  // reason; Unauthenticated unless both hold the same cluster secret or
  // neither holds one; InvalidArgument for a bad key file.
  static Result<std::unique_ptr<Store>> Attach(const std::string& socket_path,
                                               StoreOptions options = {});
  // Unmounts the embedded node; objects with no other replica disappear.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // This process's engine name; attached: the node's.
  const std::string& segment() const;
  const std::string& master_address() const;  // the master in use

  // Copies `value` into the store under a new key. AlreadyExists if the key is
  // complete, Busy while another put of it is open, InvalidArgument for a bad
  // key, an empty or too large value, or more replicas than nodes,
  // ResourceExhausted when nothing more is evictable. Blocks until every
  // replica is written and committed, or the put has failed and was aborted.
  Status Put(std::string_view key, std::span<const uint8_t> value, const PutOptions& options = {});
  // The value of a complete object. NotFound for an unknown key; Timeout if the
  // read outlived its lease.
  Result<std::vector<uint8_t>> Get(std::string_view key);

  // Registers a caller buffer with the engine for PutFrom/GetInto, which move
  // data straight between it and the nodes (no staging copy). The buffer must
  // stay valid until UnregisterBuffer. AlreadyExists on overlap.
  Status RegisterBuffer(void* data, size_t size);
  Status UnregisterBuffer(void* data);
  // Memory that is registered for PutFrom/GetInto as it is returned; attached,
  // it is shared with the node, which then moves bytes with no copy.
  Result<std::shared_ptr<StoreMemory>> AllocateBuffer(size_t size);
  // As Put/Get, on registered memory; InvalidArgument if the range is not
  // inside one registered buffer. GetInto returns the value's size and fails
  // with OutOfRange when `buffer` is smaller than the value.
  Status PutFrom(std::string_view key, StoreBuffer buffer, const PutOptions& options = {});
  Result<size_t> GetInto(std::string_view key, StoreBuffer buffer, const GetOptions& options = {});

  // OK if a complete object exists, NotFound if not.
  Status Exists(std::string_view key);
  // Busy while the object is leased or being written, unless `force`.
  Status Remove(std::string_view key, bool force = false);
  // Pins or unpins (StorePin::kNone) a complete object.
  Status Pin(std::string_view key, StorePin pin, std::chrono::milliseconds ttl = {});
  // Removes every object of the store that Remove would (all of them with
  // `force`); returns how many.
  Result<uint64_t> RemoveAll(bool force = false);
  // Capacity, use, nodes and objects, as the master counts them.
  Result<StoreStats> Stats();
  // Locations of a complete object, granting a read lease that runs its full
  // term (ObjectLocation::lease): the space is not reused before it ends.
  Result<ObjectLocation> Locate(std::string_view key);

  // Batch forms: one result per key, in order; all items share each master
  // call and one engine batch.
  std::vector<Status> BatchPut(std::span<const std::string> keys,
                               std::span<const std::span<const uint8_t>> values,
                               const PutOptions& options = {});
  std::vector<Result<std::vector<uint8_t>>> BatchGet(std::span<const std::string> keys);
  std::vector<Status> BatchPutFrom(std::span<const std::string> keys,
                                   std::span<const StoreBuffer> buffers,
                                   const PutOptions& options = {});
  std::vector<Result<size_t>> BatchGetInto(std::span<const std::string> keys,
                                           std::span<const StoreBuffer> buffers,
                                           const GetOptions& options = {});
  // Multi-buffer forms: each object is the concatenation of its buffers, in
  // order. BatchPutParts takes any host memory (as Put) and GPU memory,
  // registered or not, read after options.stream's earlier work; the others
  // need registered memory (as PutFrom and GetInto). A get fills the buffers
  // in order and fails with OutOfRange when their sum is smaller than the value.
  std::vector<Status> BatchPutParts(std::span<const std::string> keys,
                                    std::span<const std::vector<StoreBuffer>> parts,
                                    const PutOptions& options = {});
  std::vector<Status> BatchPutFromMulti(std::span<const std::string> keys,
                                        std::span<const std::vector<StoreBuffer>> buffers,
                                        const PutOptions& options = {});
  std::vector<Result<size_t>> BatchGetIntoMulti(std::span<const std::string> keys,
                                                std::span<const std::vector<StoreBuffer>> buffers,
                                                const GetOptions& options = {});
  // As BatchGetIntoMulti, into any memory: host memory by copy, GPU memory
  // (registered or not) as GetOptions says.
  std::vector<Result<size_t>> BatchGetIntoParts(std::span<const std::string> keys,
                                                std::span<const std::vector<StoreBuffer>> parts,
                                                const GetOptions& options = {});
  std::vector<Status> BatchExists(std::span<const std::string> keys);
  std::vector<Status> BatchRemove(std::span<const std::string> keys, bool force = false);
  std::vector<Result<ObjectLocation>> BatchLocate(std::span<const std::string> keys);
  std::vector<Status> BatchPin(std::span<const std::string> keys, StorePin pin,
                               std::chrono::milliseconds ttl = {});

  // What a Store forwards to; made only by Ferry's own factories (Create,
  // Attach, and the test hooks of store/client/testing.h).
  class Impl;
  explicit Store(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
