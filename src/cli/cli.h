// Subcommands of the `ferry` command. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.h"

namespace ferry {
class Engine;
namespace store {
struct MasterServerOptions;
}
}  // namespace ferry

namespace ferry::cli {

struct ServeArgs {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string transport;
  std::string metadata = "p2p";     // EngineOptions::metadata: p2p or etcd://...
  uint64_t alloc_bytes = 64 << 20;  // engine-allocated (memfd) memory
  bool prefault = false;            // touch every page of it at start, as a store node does
  bool non_dumpable = false;        // untraceable by its own uid, as a hardened application is
  uint64_t heap_bytes = 0;          // plain heap memory, registered
  uint64_t gpu_bytes = 0;           // GPU memory on gpu_device, registered
  int gpu_device = 0;
};
int Serve(const ServeArgs& args);

struct BenchArgs {
  std::string mode;  // "", "target" or "initiator"
  std::string transport = "tcp";
  std::string op = "write";
  uint64_t block_size = 1 << 20;
  int batch_size = 16;
  int threads = 1;
  int gpu_src = -1;  // the source buffer lives on this GPU
  int gpu_dst = -1;  // the destination buffer lives on this GPU
  double duration = 3.0;
  bool json = false;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string peer;         // initiator: the target's segment name
  uint16_t ref_port = 0;    // initiator: the target's raw reference socket
  bool ref_spread = false;  // the raw streams cycle through the batch's bytes
  // With GPU memory over tcp: the hand-staged streams again with the
  // receiving end's write-back, whole and in pieces (reference_staged_variants).
  bool ref_staged_variants = false;
  int fresh = 0;  // then this many passes, each into target memory set up just before
  std::string memory = "engine";  // host buffers: engine-allocated, or registered heap ("heap")
  // "VAR=VALUE" set in the target's or the initiator's process alone, before
  // its engine starts: settings of one side to compare.
  std::vector<std::string> target_env, initiator_env;
};
int BenchTransfer(const BenchArgs& args);

struct DemoArgs {
  uint64_t bytes = 1ull << 30;  // per transport
  uint64_t buffer = 256ull << 20;
};
int Demo(const DemoArgs& args);

struct MasterArgs {
  std::string host = "127.0.0.1";
  uint16_t port = 0;    // gRPC; 0 picks one
  int http_port = 0;    // /metrics and /health; 0 picks one, -1 none
  int socket_port = 0;  // the data path's calls over TCP; 0 picks one, -1 none
  int64_t lease_ms = 5000;
  int64_t put_timeout_ms = 10000;
  int64_t write_grace_ms = 1000;
  int64_t node_ttl_ms = 5000;
  int64_t tick_ms = 100;
  double high_watermark = 0.90;
  double low_watermark = 0.80;
  int shards = 16;
  uint64_t max_object_size = 1ull << 32;
  // The fencing term (store::MasterOptions::term); -1: the wall clock in ms,
  // so a restarted master's is higher than its predecessor's.
  int64_t term = -1;
  // Cluster mode (master_ha.cc): a candidate elected through etcd, whose
  // term the election gives. Empty etcd: a single master.
  std::string etcd;                // "host:port[,host:port...]"
  std::string cluster;             // names the cluster's keys in etcd
  int64_t leader_ttl_s = 5;        // the leader's lease: a dead leader is replaced after it
  int64_t etcd_timeout_ms = 2000;  // each etcd call, per endpoint
  // store::MasterOptions::catalog_sync; -1: 1000 ms in cluster mode, where a
  // master's successor rebuilds from the nodes, else 0 (off).
  int64_t catalog_sync_ms = -1;
  std::string auth_key_file;  // the cluster secret; empty: FERRY_AUTH_KEY_FILE, if set
  // Lines printed once on stderr at start: the Mooncake flags that were
  // accepted but mean nothing in Ferry (ApplyMooncakeMasterFlags).
  std::vector<std::string> notices;
};
int Master(const MasterArgs& args);
// `ferry master --etcd`: Master's body once its options are made.
int MasterWithElection(const MasterArgs& args, const store::MasterServerOptions& options);

// `mooncake_master`'s flag spellings, accepted by `ferry master` so that a
// deployment script switches by changing the binary (docs/mooncake-compat.md).
// Named without their dashes; each takes at most one value. `help` is empty
// for the flags accepted only to be reported (hidden from --help).
struct MooncakeFlag {
  std::string name;
  std::string help;
};
const std::vector<MooncakeFlag>& MooncakeMasterFlags();
// Maps the Mooncake flags given (name -> value, "" when given bare) onto
// `args`. `ferry_given` holds Ferry's own master options given, as spelled
// ("--lease-ms"): giving both spellings of one setting is refused.
// InvalidArgument for a bad value or for --enable_ha (no cluster mode yet).
Status ApplyMooncakeMasterFlags(const std::vector<std::pair<std::string, std::string>>& given,
                                const std::vector<std::string>& ferry_given, MasterArgs* args);
// Mooncake's durations: milliseconds, or a number with ms, s, m or h.
Result<int64_t> ParseDurationMs(const std::string& text);

struct NodeArgs {
  std::string master;        // host:port, or etcd://ENDPOINTS/CLUSTER; empty: run one here
  uint16_t master_port = 0;  // the master run here, on host; 0 picks
  // Cluster mode: the same as master etcd://<etcd>/<cluster>.
  std::string etcd, cluster;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string transport;
  uint64_t segment_size = 256ull << 20;
  int segments = 1;
  int64_t heartbeat_ms = 1000;
  std::string socket;                     // serve attached applications here, if set
  std::vector<uint32_t> allow_uids;       // may attach besides this uid and root
  uint64_t reserve_bytes = 256ull << 20;  // attached puts' store::CoreOptions::reserve_bytes
  // The cluster secret, for the engine, the master calls and the socket;
  // empty: FERRY_AUTH_KEY_FILE, if set.
  std::string auth_key_file;
};
int Node(const NodeArgs& args);

struct BenchStoreArgs {
  uint64_t value_size = 4ull << 20;
  int values = 64;
  int batch = 16;
  int nodes = 1;
  std::string transport = "tcp";  // how the client reaches the nodes: tcp|auto
  bool attach = false;            // attached to the first node's socket instead
  bool master_in_node = false;    // the first node runs the master
  double metadata_seconds = 1.0;  // per metadata measurement
  int64_t catalog_sync_ms = 0;    // the master's --catalog-sync-ms: what a cluster's puts pay
  uint64_t reserve_bytes = 256ull << 20;  // StoreOptions::reserve_bytes, and the node's
  bool json = false;
};
int BenchStore(const BenchStoreArgs& args);

struct StoreArgs {
  std::string master;  // host:port, or
  std::string socket;  // a node's attach socket
  int64_t timeout_ms = 5000;
  std::string command;  // put, get, exists, rm or stat
  std::string key;
  std::string file;  // put: input ("-": stdin); get: output (empty or "-": stdout)
  bool force = false;
  std::string auth_key_file;  // the cluster secret; empty: FERRY_AUTH_KEY_FILE, if set
};
int StoreCommand(const StoreArgs& args);
int BenchStoreLatency(const StoreArgs& args, uint64_t size, int iterations);

// "4096", "64KiB", "1MiB", "2GiB", "1G" (binary multiples).
Result<uint64_t> ParseSize(const std::string& s);

// Blocks SIGINT and SIGTERM in every thread started after it, then waits for one.
// SIGUSR1 is blocked too, for commands that take it as a request (`ferry
// serve`), so it never kills a server.
void BlockStopSignals();
// The signal that came: SIGINT, SIGTERM, or with `or_usr1` SIGUSR1.
int WaitForStopSignal(bool or_usr1 = false);

// For commands that serve until SIGTERM: blocks the stop signals, then makes
// an engine listening on host:port, whose peers prove the secret in
// `auth_key_file` (empty: FERRY_AUTH_KEY_FILE, if set). On failure says why
// on stderr, prefixed by `who`, and returns null.
std::unique_ptr<Engine> StartServingEngine(const char* who, const std::string& host, uint16_t port,
                                           const std::string& transport,
                                           const std::string& auth_key_file = "",
                                           const std::string& metadata = "p2p");

}  // namespace ferry::cli
