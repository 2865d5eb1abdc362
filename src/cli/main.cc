// The `ferry` command.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <limits>

#include "cli/cli.h"
#include "ferry/engine.h"

namespace ferry::cli {

Result<uint64_t> ParseSize(const std::string& s) {
  size_t pos = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    return Status::InvalidArgument("bad size '" + s + "'");
  }
  std::string unit = s.substr(pos);
  uint64_t mul = 1;
  if (unit == "" || unit == "B")
    mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k")
    mul = 1ull << 10;
  else if (unit == "M" || unit == "MiB")
    mul = 1ull << 20;
  else if (unit == "G" || unit == "GiB")
    mul = 1ull << 30;
  else
    return Status::InvalidArgument("bad size unit in '" + s + "'");
  return v * mul;
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForStopSignal(bool or_usr1) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (or_usr1) sigaddset(&set, SIGUSR1);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

std::unique_ptr<Engine> StartServingEngine(const char* who, const std::string& host, uint16_t port,
                                           const std::string& transport,
                                           const std::string& auth_key_file,
                                           const std::string& metadata) {
  BlockStopSignals();  // before the engine starts its threads, so they inherit it
  EngineOptions o;
  o.host = host;
  o.port = port;
  o.transport = transport;
  o.auth_key_file = auth_key_file;
  o.metadata = metadata;
  auto engine = Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, engine.status().ToString().c_str());
    return nullptr;
  }
  return std::move(engine).value();
}

}  // namespace ferry::cli

namespace {

// Validates a size option given as text.
bool SizeOption(const std::string& text, uint64_t* out, const char* flag) {
  auto r = ferry::cli::ParseSize(text);
  if (!r.ok()) {
    std::cerr << "ferry: " << flag << ": " << r.status().ToString() << "\n";
    return false;
  }
  *out = r.value();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::cli;
  CLI::App app{"Ferry: moves KV cache and tensors between processes, hosts and GPUs"};
  app.require_subcommand(1);

  ServeArgs serve;
  std::string serve_alloc = "64MiB", serve_heap = "0", serve_gpu = "0";
  auto* s = app.add_subcommand("serve", "Run an engine that exposes memory until SIGTERM");
  s->add_option("--host", serve.host, "Address to listen on");
  s->add_option("--port", serve.port, "Port (0 picks one)");
  s->add_option("--transport", serve.transport, "Force tcp or shm");
  s->add_option("--metadata", serve.metadata,
                "p2p, or etcd://host:port[,host:port]/CLUSTER to publish in etcd");
  s->add_option("--alloc", serve_alloc, "Engine-allocated (memfd) bytes to expose");
  s->add_option("--heap", serve_heap, "Heap bytes to register and expose");
  s->add_flag("--prefault", serve.prefault, "Touch every page of --alloc at start");
  s->add_flag("--non-dumpable", serve.non_dumpable,
              "Forbid tracing the process first (PR_SET_DUMPABLE 0), as hardened applications do");
  s->add_option("--gpu-alloc", serve_gpu,
                "GPU bytes to register and expose; SIGUSR1 swaps it for a new registration");
  s->add_option("--gpu-device", serve.gpu_device, "The GPU of --gpu-alloc")
      ->check(CLI::Range(0, 63));

  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  BenchArgs b;
  std::string block = "1MiB";
  auto* bt = bench->add_subcommand("transfer", "Engine throughput against its physical reference");
  bt->add_option("--mode", b.mode, "target|initiator; default spawns both on loopback")
      ->check(CLI::IsMember({"target", "initiator"}));
  bt->add_option("--transport", b.transport, "tcp|shm|auto")
      ->check(CLI::IsMember({"tcp", "shm", "auto"}));
  bt->add_option("--op", b.op, "write|read")->check(CLI::IsMember({"write", "read"}));
  bt->add_option("--block-size", block, "Bytes per request (e.g. 65536, 1MiB)");
  bt->add_option("--batch-size", b.batch_size, "Requests per batch")->check(CLI::Range(1, 65536));
  bt->add_option("--threads", b.threads, "Submitting threads")->check(CLI::Range(1, 64));
  bt->add_option("--duration", b.duration, "Seconds of engine traffic")
      ->check(CLI::Range(0.1, 3600.0));
  bt->add_option("--gpu-src", b.gpu_src, "Put the source buffer on this GPU")
      ->check(CLI::Range(0, 63));
  bt->add_option("--gpu-dst", b.gpu_dst, "Put the destination buffer on this GPU")
      ->check(CLI::Range(0, 63));
  bt->add_flag("--json", b.json, "End with one JSON line");
  bt->add_option("--host", b.host, "target: address to listen on");
  bt->add_option("--port", b.port, "target: port (0 picks one)");
  bt->add_option("--peer", b.peer, "initiator: the target's segment, host:port");
  bt->add_option("--ref-port", b.ref_port, "initiator: the target's reference socket port");
  bt->add_flag("--ref-staged-variants", b.ref_staged_variants,
               "tcp, GPU memory: the hand-staged streams also with the receiver's write-back, "
               "whole and in pieces of 256 and 64 KiB, and in pieces without it");
  bt->add_flag("--ref-spread", b.ref_spread,
               "tcp: the raw streams cycle through as many bytes as the engine's batches "
               "touch, not one block");
  bt->add_option("--fresh", b.fresh,
                 "Then time N single passes, each over target memory set up just before it "
                 "(engine-allocated; registered heap over tcp): what a first transfer costs")
      ->check(CLI::Range(0, 100));
  bt->add_option("--memory", b.memory,
                 "Host buffers on both sides: engine (AllocateMemory, memfd) or heap (anonymous "
                 "memory advised to huge pages, registered)")
      ->check(CLI::IsMember({"engine", "heap"}));
  const CLI::Validator var_value(
      [](const std::string& s) {
        const size_t eq = s.find('=');
        return eq == 0 || eq == std::string::npos ? "'" + s + "' is not VAR=VALUE" : "";
      },
      "VAR=VALUE");
  bt->add_option("--target-env", b.target_env,
                 "VAR=VALUE set in the target's process alone (repeatable)")
      ->check(var_value);
  bt->add_option("--initiator-env", b.initiator_env,
                 "VAR=VALUE set in the initiator's process alone (repeatable)")
      ->check(var_value);

  MasterArgs ma;
  std::string ma_max = "4GiB";
  auto* m = app.add_subcommand("master", "Run the store's master until SIGTERM");
  m->add_option("--host", ma.host, "Address to serve gRPC and HTTP on");
  m->add_option("--port", ma.port, "gRPC port (0 picks one)");
  m->add_option("--http-port", ma.http_port, "HTTP port for /metrics and /health (0 picks, -1 off)")
      ->check(CLI::Range(-1, 65535));
  m->add_option("--socket-port", ma.socket_port,
                "TCP port of the data path's calls, besides gRPC (0 picks, -1 off: gRPC only)")
      ->check(CLI::Range(-1, 65535));
  m->add_option("--lease-ms", ma.lease_ms, "Read lease granted by a get")
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  m->add_option("--put-timeout-ms", ma.put_timeout_ms, "Open puts are reclaimed after this")
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  m->add_option("--write-grace-ms", ma.write_grace_ms, "Aborted space waits this for late writes")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  m->add_option("--node-ttl-ms", ma.node_ttl_ms, "A node silent this long is unmounted")
      ->check(CLI::Range(int64_t{10}, int64_t{86400000}));
  m->add_option("--tick-ms", ma.tick_ms, "Background reclaim/expiry/eviction period")
      ->check(CLI::Range(int64_t{1}, int64_t{60000}));
  m->add_option("--term", ma.term,
                "Fencing term; nodes and clients refuse older ones (default: the clock in ms)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  m->add_option("--high-watermark", ma.high_watermark, "Evict in the background above this")
      ->check(CLI::Range(0.0, 1.0));
  m->add_option("--low-watermark", ma.low_watermark, "... down to this fraction used")
      ->check(CLI::Range(0.0, 1.0));
  m->add_option("--shards", ma.shards, "Metadata shards")->check(CLI::Range(1, 4096));
  m->add_option("--max-object-size", ma_max, "Largest value accepted");
  m->add_option("--auth-key-file", ma.auth_key_file,
                "Cluster secret file (mode 0600); default $FERRY_AUTH_KEY_FILE");
  m->add_option("--etcd", ma.etcd,
                "Cluster mode: etcd endpoints host:port[,host:port]; masters elect a leader");
  m->add_option("--cluster", ma.cluster, "Cluster mode: the cluster's name in etcd");
  m->add_option("--leader-ttl-s", ma.leader_ttl_s, "Cluster mode: the leader's lease TTL")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  m->add_option("--catalog-sync-ms", ma.catalog_sync_ms,
                "A put or remove returns once its nodes cataloged it, waiting up to this "
                "(0 off; default 1000 with --etcd, else 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  // Mooncake's `mooncake_master` spellings, mapped by ApplyMooncakeMasterFlags.
  std::vector<std::pair<std::string, std::string>> ma_mooncake;
  for (const MooncakeFlag& f : MooncakeMasterFlags()) {
    const std::string name = f.name;
    m->add_option_function<std::string>(
         "--" + name,
         [&ma_mooncake, name](const std::string& v) { ma_mooncake.emplace_back(name, v); }, f.help)
        ->expected(0, 1)
        ->group(f.help.empty() ? "" : "Mooncake spellings");
  }

  NodeArgs na;
  std::string na_size = "256MiB";
  auto* n = app.add_subcommand("node", "Contribute memory to the store until SIGTERM");
  n->add_option("--master", na.master,
                "The master, host:port or etcd://ENDPOINTS/CLUSTER; none: this node runs one");
  n->add_option("--master-port", na.master_port,
                "Without --master: the gRPC port of the master it runs (0 picks one)");
  n->add_option("--etcd", na.etcd, "Cluster mode: etcd endpoints; follow the elected master");
  n->add_option("--cluster", na.cluster, "Cluster mode: the cluster's name in etcd");
  n->add_option("--host", na.host, "Engine address to listen on");
  n->add_option("--port", na.port, "Engine port (0 picks one)");
  n->add_option("--transport", na.transport, "Force tcp or shm");
  n->add_option("--segment-size", na_size, "Bytes per segment");
  std::string na_reserve = "256MiB";
  n->add_option("--reserve-bytes", na_reserve,
                "Attached puts: space reserved at the master ahead of need, at most (0: none)");
  n->add_option("--segments", na.segments, "Segments to contribute")->check(CLI::Range(1, 64));
  n->add_option("--heartbeat-ms", na.heartbeat_ms, "Heartbeat period")
      ->check(CLI::Range(int64_t{1}, int64_t{60000}));
  n->add_option("--socket", na.socket,
                "Serve the applications of this host on this Unix socket path (mode 0600)");
  n->add_option("--allow-uid", na.allow_uids,
                "A uid that may attach besides this one and root (repeatable)");
  n->add_option("--auth-key-file", na.auth_key_file,
                "Cluster secret (mode 0600) for the engine, the master and the socket; "
                "default $FERRY_AUTH_KEY_FILE");

  BenchStoreArgs bs;
  std::string bs_value = "4MiB";
  auto* bsc = bench->add_subcommand("store", "Store batch put/get against the engine and Redis");
  bsc->add_option("--value-size", bs_value, "Bytes per value");
  bsc->add_option("--values", bs.values, "Values put and got")->check(CLI::Range(1, 1 << 20));
  bsc->add_option("--batch", bs.batch, "Values per batch")->check(CLI::Range(1, 4096));
  bsc->add_option("--nodes", bs.nodes, "Node processes")->check(CLI::Range(1, 8));
  bsc->add_option("--transport", bs.transport, "tcp|auto between client and nodes")
      ->check(CLI::IsMember({"tcp", "auto"}));
  bsc->add_option("--metadata-seconds", bs.metadata_seconds, "Per metadata measurement")
      ->check(CLI::Range(0.0, 600.0));
  bsc->add_option("--catalog-sync-ms", bs.catalog_sync_ms,
                  "The master's --catalog-sync-ms (an elected master's default is 1000)")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  std::string bs_reserve = "256MiB";
  bsc->add_option("--reserve-bytes", bs_reserve,
                  "The client's (or, attached, the node's) space reserved ahead of puts; 0: none");
  bsc->add_flag("--attach", bs.attach,
                "Attach to the first node's --socket instead of running an engine");
  bsc->add_flag("--master-in-node", bs.master_in_node,
                "Run no master process: the first node runs it (ferry node without --master)");
  bsc->add_flag("--json", bs.json, "End with one JSON line");

  StoreArgs sa;
  auto* sc = app.add_subcommand("store", "Put, get, check and remove keys; store statistics");
  sc->require_subcommand(1);
  sc->add_option("--master", sa.master, "The master, host:port");
  sc->add_option("--socket", sa.socket, "Or the attach socket of this host's node");
  sc->add_option("--timeout-ms", sa.timeout_ms, "Deadline of each call")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}));
  sc->add_option("--auth-key-file", sa.auth_key_file,
                 "Cluster secret (mode 0600); default $FERRY_AUTH_KEY_FILE");
  auto* sc_put = sc->add_subcommand("put", "Store FILE (- for stdin) under KEY");
  sc_put->add_option("key", sa.key)->required();
  sc_put->add_option("file", sa.file)->required();
  auto* sc_get = sc->add_subcommand("get", "Write KEY's value to FILE, or stdout");
  sc_get->add_option("key", sa.key)->required();
  sc_get->add_option("file", sa.file);
  auto* sc_exists = sc->add_subcommand("exists", "true (exit 0) or false (exit 1)");
  sc_exists->add_option("key", sa.key)->required();
  auto* sc_rm = sc->add_subcommand("rm", "Remove KEY");
  sc_rm->add_option("key", sa.key)->required();
  sc_rm->add_flag("--force", sa.force, "Also while it is read or written");
  auto* sc_stat = sc->add_subcommand("stat", "Capacity, use, nodes and objects, as JSON");
  for (auto* c : {sc_put, sc_get, sc_exists, sc_rm, sc_stat}) {
    c->callback([c, &sa] { sa.command = c->get_name(); });
  }

  StoreArgs la;
  std::string la_size = "4096";
  int la_iterations = 2000;
  auto* bsl = bench->add_subcommand("store-latency",
                                    "Median GetInto of one value, one call at a time (JSON)");
  bsl->add_option("--master", la.master, "The master, host:port");
  bsl->add_option("--socket", la.socket, "Or a node's attach socket");
  bsl->add_option("--size", la_size, "Value bytes");
  bsl->add_option("--iterations", la_iterations, "Timed calls")->check(CLI::Range(1, 10000000));

  DemoArgs d;
  std::string demo_bytes = "1GiB";
  auto* demo = app.add_subcommand("demo", "Move and verify data through every transport");
  demo->add_option("--bytes", demo_bytes, "Bytes to write, and read back, per transport");

  // gflags also takes one dash (-eviction_ratio=0.1): `ferry master` gives
  // Mooncake's flags their second one.
  std::vector<std::string> arg_text(argv, argv + argc);
  if (argc > 1 && arg_text[1] == "master") {
    const auto& mooncake = MooncakeMasterFlags();
    for (size_t i = 2; i < arg_text.size(); ++i) {
      std::string& a = arg_text[i];
      if (a.size() < 3 || a[0] != '-' || a[1] == '-') continue;
      const std::string name = a.substr(1, a.find('=') - 1);
      if (name == "port" || std::any_of(mooncake.begin(), mooncake.end(),
                                        [&](const MooncakeFlag& f) { return f.name == name; })) {
        a.insert(0, "-");
      }
    }
  }
  std::vector<char*> arg_ptrs;
  for (auto& a : arg_text) arg_ptrs.push_back(a.data());
  CLI11_PARSE(app, argc, arg_ptrs.data());

  if (s->parsed()) {
    if (!SizeOption(serve_alloc, &serve.alloc_bytes, "--alloc") ||
        !SizeOption(serve_heap, &serve.heap_bytes, "--heap") ||
        !SizeOption(serve_gpu, &serve.gpu_bytes, "--gpu-alloc")) {
      return 2;
    }
    return Serve(serve);
  }
  if (bt->parsed()) {
    if (!SizeOption(block, &b.block_size, "--block-size")) return 2;
    if (b.block_size == 0) {
      std::cerr << "ferry: --block-size must be positive\n";
      return 2;
    }
    return BenchTransfer(b);
  }
  if (m->parsed()) {
    if (!SizeOption(ma_max, &ma.max_object_size, "--max-object-size")) return 2;
    std::vector<std::string> ferry_given;
    for (const char* f :
         {"--host", "--port", "--http-port", "--lease-ms", "--put-timeout-ms", "--node-ttl-ms",
          "--high-watermark", "--low-watermark", "--etcd", "--cluster"}) {
      if (m->count(f) > 0) ferry_given.emplace_back(f);
    }
    if (auto st = ApplyMooncakeMasterFlags(ma_mooncake, ferry_given, &ma); !st.ok()) {
      std::cerr << "ferry master: " << st.message() << "\n";
      return 2;
    }
    if (ma.low_watermark > ma.high_watermark) {
      std::cerr << "ferry: --low-watermark must not exceed --high-watermark\n";
      return 2;
    }
    return Master(ma);
  }
  if (n->parsed()) {
    if (!SizeOption(na_size, &na.segment_size, "--segment-size") ||
        !SizeOption(na_reserve, &na.reserve_bytes, "--reserve-bytes")) {
      return 2;
    }
    return Node(na);
  }
  if (bsc->parsed()) {
    if (!SizeOption(bs_value, &bs.value_size, "--value-size") ||
        !SizeOption(bs_reserve, &bs.reserve_bytes, "--reserve-bytes")) {
      return 2;
    }
    if (bs.value_size == 0) {
      std::cerr << "ferry: --value-size must be positive\n";
      return 2;
    }
    return BenchStore(bs);
  }
  if (sc->parsed()) return StoreCommand(sa);
  if (bsl->parsed()) {
    uint64_t size = 0;
    if (!SizeOption(la_size, &size, "--size") || size == 0) return 2;
    return BenchStoreLatency(la, size, la_iterations);
  }
  if (demo->parsed()) {
    if (!SizeOption(demo_bytes, &d.bytes, "--bytes")) return 2;
    return Demo(d);
  }
  return 2;
}
