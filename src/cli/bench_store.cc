// `ferry bench store`: batch put and get through a master and node processes,
// next to what the same bytes cost through the bare engine (tcp, the same
// batches, measured in the same run) and through Redis SET/GET (4 pipelined
// connections). Also the master's metadata rate: exists and get-locations in
// batches of 128. Every run also times a single-thread memcpy of the same
// bytes, the bound for a same-host store (--attach, or --transport auto).
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_util.h"
#include "cli/cli.h"
#include "cli/local_cluster.h"
#include "cli/redis_reference.h"
#include "common/clock.h"
#include "common/prefault.h"
#include "common/subprocess.h"
#include "ferry/engine.h"
#include "ferry/store.h"

namespace ferry::cli {
namespace {

constexpr int kRedisConnections = 4;
constexpr size_t kMetadataBatch = 128;

struct Phase {
  double seconds = 0;
  std::vector<double> batch_ms;
};

double Gbps(uint64_t bytes, double secs) {
  return secs > 0 ? static_cast<double>(bytes) / secs / 1e9 : 0;
}

// The engine alone: a `ferry serve` peer holding as many bytes as the store's
// values, written and read in the same batches at the same distinct offsets.
// Its memory is faulted in at start the way a store node's is (common/prefault.h):
// on this VM, receiving into pages that were never faulted in for the kernel is
// several times slower.
struct EngineReference {
  std::unique_ptr<Subprocess> peer;
  std::unique_ptr<Engine> engine;
  SegmentId seg = 0;
  uint64_t remote = 0;

  static Result<EngineReference> Start(const std::string& transport, uint64_t bytes) {
    EngineReference r;
    FERRY_ASSIGN_OR_RETURN(
        auto j,
        SpawnReady({SelfExe(), "serve", "--prefault", "--alloc", std::to_string(bytes)}, &r.peer));
    if (!j.contains("alloc")) return Status::Internal("serve said: " + j.dump());
    EngineOptions eo;
    eo.transport = transport == "tcp" ? "tcp" : "";
    FERRY_ASSIGN_OR_RETURN(r.engine, Engine::Create(eo));
    FERRY_ASSIGN_OR_RETURN(r.seg, r.engine->OpenSegment(j["segment"].get<std::string>()));
    r.remote = j["alloc"]["addr"];
    return r;
  }

  // Batch `b` of `buffers` moved by `op`; the seconds it took.
  Result<double> Batch(Op op, const std::vector<StoreBuffer>& buffers, int b) {
    const uint64_t span = buffers.size() * buffers[0].size;
    std::vector<Request> reqs;
    for (size_t i = 0; i < buffers.size(); ++i) {
      reqs.push_back({op, buffers[i].data, seg,
                      remote + span * static_cast<uint64_t>(b) + i * buffers[i].size,
                      buffers[i].size});
    }
    auto t0 = Clock::now();
    FERRY_ASSIGN_OR_RETURN(auto batch, engine->Submit(reqs));
    FERRY_RETURN_IF_ERROR(batch->Wait(std::chrono::seconds(60)));
    return SecondsSince(t0);
  }
};

// Batches of 128 metadata calls for `seconds`; calls per second.
template <typename F>
double MetadataRate(const std::vector<std::string>& keys, double seconds, F&& call) {
  std::vector<std::string> batch;
  for (size_t i = 0; i < kMetadataBatch; ++i) batch.push_back(keys[i % keys.size()]);
  uint64_t calls = 0;
  auto t0 = Clock::now();
  do {
    if (!call(batch)) return 0;
    calls += batch.size();
  } while (SecondsSince(t0) < seconds);
  return static_cast<double>(calls) / SecondsSince(t0);
}

int Fail(const Status& st) {
  std::fprintf(stderr, "ferry bench store: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int BenchStore(const BenchStoreArgs& a) {
  if (a.master_in_node && a.catalog_sync_ms != 0) {
    return Fail(Status::InvalidArgument("--catalog-sync-ms needs a master process"));
  }
  const int batches = (a.values + a.batch - 1) / a.batch;
  const int values = batches * a.batch;  // whole batches
  const uint64_t span = a.value_size * static_cast<uint64_t>(a.batch);
  const uint64_t total = a.value_size * static_cast<uint64_t>(values);
  // Nodes hold every value and the warm-up batch under the background
  // eviction watermark (90%), so nothing is evicted.
  const uint64_t per_node =
      ((total + span) / static_cast<uint64_t>(a.nodes)) * 3 / 2 + (16ull << 20);

  // With master_in_node the first node runs the master (one `ferry node`
  // serving the host), and its attached calls reach it directly.
  Result<MasterProcess> master = MasterProcess{};
  if (!a.master_in_node) {
    master = SpawnMaster(
        SelfExe(), {"--http-port", "-1", "--catalog-sync-ms", std::to_string(a.catalog_sync_ms)});
  }
  if (!master.ok()) return Fail(master.status());
  std::string master_address = master.value().address;
  // Attached, the client talks to the first node over its socket.
  const std::string sock =
      a.attach ? "/tmp/ferry-bench-store-" + std::to_string(getpid()) + ".sock" : "";
  std::vector<NodeProcess> nodes;
  for (int i = 0; i < a.nodes; ++i) {
    std::vector<std::string> args = {"--segment-size", std::to_string(per_node), "--reserve-bytes",
                                     std::to_string(a.reserve_bytes)};
    if (i == 0 && a.attach) args.insert(args.end(), {"--socket", sock});
    auto n = SpawnNode(SelfExe(), master_address, args);
    if (!n.ok()) return Fail(n.status());
    master_address = n.value().master;
    nodes.push_back(std::move(n).value());
  }
  StoreOptions so;
  so.master = master_address;
  so.local_memory = 0;  // every byte crosses to a node process
  so.reserve_bytes = a.reserve_bytes;
  so.engine.transport = a.transport == "tcp" ? "tcp" : "";
  auto store = a.attach ? Store::Attach(sock, so) : Store::Create(so);
  if (!store.ok()) return Fail(store.status());
  Store& s = *store.value();
  auto engine = EngineReference::Start(a.transport, total + span);
  if (!engine.ok()) return Fail(engine.status());
  auto redis = RedisReference::Start(kRedisConnections);
  if (!redis.ok()) return Fail(redis.status());

  // One registered source and destination area of a batch; value k of a batch
  // has its own pattern, so a misplaced value is caught. Attached, they come
  // from AllocateBuffer, which the node reads and writes with no copy.
  std::vector<uint8_t> src_heap, dst_heap;
  std::shared_ptr<StoreMemory> src_mem, dst_mem;
  uint8_t *src = nullptr, *dst = nullptr;
  if (a.attach) {
    auto m1 = s.AllocateBuffer(span);
    auto m2 = m1.ok() ? s.AllocateBuffer(span) : m1;
    if (!m2.ok()) return Fail(m2.status());
    src_mem = m1.value();
    dst_mem = m2.value();
    src = static_cast<uint8_t*>(src_mem->data());
    dst = static_cast<uint8_t*>(dst_mem->data());
  } else {
    src_heap.resize(span);
    dst_heap.resize(span);
    src = src_heap.data();
    dst = dst_heap.data();
    if (Status st = s.RegisterBuffer(src, span); !st.ok()) return Fail(st);
    if (Status st = s.RegisterBuffer(dst, span); !st.ok()) return Fail(st);
  }
  for (uint64_t i = 0; i < span; ++i) src[i] = static_cast<uint8_t>((i * 131) ^ (i >> 12));
  // The memcpy reference: the same bytes into and out of distinct places of
  // memory faulted in beforehand, as a node's is.
  std::vector<uint8_t> copy_area(total + span);
  Prefault(copy_area.data(), copy_area.size());
  auto memcpy_batch = [&](bool write, int b) -> Result<double> {
    uint8_t* place = copy_area.data() + span * static_cast<uint64_t>(b);
    auto t0 = Clock::now();
    if (write) {
      std::memcpy(place, src, span);
    } else {
      std::memcpy(dst, place, span);
    }
    return SecondsSince(t0);
  };
  std::vector<StoreBuffer> src_bufs, dst_bufs;
  std::vector<std::span<const uint8_t>> src_spans;
  std::vector<std::span<uint8_t>> dst_spans;
  for (int k = 0; k < a.batch; ++k) {
    const uint64_t off = a.value_size * static_cast<uint64_t>(k);
    src_bufs.push_back({src + off, a.value_size});
    dst_bufs.push_back({dst + off, a.value_size});
    src_spans.emplace_back(src + off, a.value_size);
    dst_spans.emplace_back(dst + off, a.value_size);
  }
  auto keys_of = [&](const char* prefix, int b) {
    std::vector<std::string> keys;
    for (int k = 0; k < a.batch; ++k) keys.push_back(prefix + std::to_string(b * a.batch + k));
    return keys;
  };

  // Warm-up, untimed: connects the engines' lanes, the master channel and the
  // Redis connections.
  {
    auto warm = keys_of("warm/", 0);
    Status st;
    for (const auto& x : s.BatchPutFrom(warm, src_bufs)) st = x.ok() ? st : x;
    for (const auto& x : s.BatchGetInto(warm, dst_bufs)) st = x.ok() ? st : x.status();
    for (const auto& x : s.BatchRemove(warm, /*force=*/true)) st = x.ok() ? st : x;
    // The engine's warm-up batch goes past the timed ones, as the store's
    // warm-up values take space the timed ones do not reuse.
    if (st.ok()) st = engine.value().Batch(Op::kWrite, src_bufs, batches).status();
    if (st.ok()) st = engine.value().Batch(Op::kRead, dst_bufs, batches).status();
    // Redis gets the same head start as the nodes' prefaulted memory: every
    // key is set once, so the timed SETs overwrite into memory it has used.
    for (int b = 0; b < batches && st.ok(); ++b) {
      st = redis.value()->Set(keys_of("bench/", b), src_spans).status();
    }
    if (st.ok()) st = redis.value()->Get(keys_of("bench/", 0), dst_spans).status();
    if (!st.ok()) return Fail(st);
  }

  // Each batch goes through the store, the engine, memcpy and Redis in turn,
  // so that all see the same machine load.
  Phase put, get, eng_w, eng_r, red_set, red_get, mem_w, mem_r;
  auto timed = [](Phase& p, Result<double> r) {
    if (r.ok()) {
      p.seconds += r.value();
      p.batch_ms.push_back(r.value() * 1e3);
    }
    return r.status();
  };
  std::vector<std::string> all_keys;
  // Odd batches run the engine first, so neither side always follows the other.
  for (int b = 0; b < batches; ++b) {
    auto keys = keys_of("bench/", b);
    Status st;
    if (b % 2 == 1) st = timed(eng_w, engine.value().Batch(Op::kWrite, src_bufs, b));
    auto t0 = Clock::now();
    for (const auto& x : s.BatchPutFrom(keys, src_bufs)) st = x.ok() ? st : x;
    if (st.ok()) st = timed(put, SecondsSince(t0));
    if (st.ok() && b % 2 == 0) st = timed(eng_w, engine.value().Batch(Op::kWrite, src_bufs, b));
    if (st.ok()) st = timed(mem_w, memcpy_batch(true, b));
    if (st.ok()) st = timed(red_set, redis.value()->Set(keys, src_spans));
    if (!st.ok()) return Fail(st);
    all_keys.insert(all_keys.end(), keys.begin(), keys.end());
  }
  for (int b = 0; b < batches; ++b) {
    auto keys = keys_of("bench/", b);
    Status st;
    if (b % 2 == 1) st = timed(eng_r, engine.value().Batch(Op::kRead, dst_bufs, b));
    std::memset(dst, 0, span);
    auto t0 = Clock::now();
    for (const auto& x : s.BatchGetInto(keys, dst_bufs)) st = x.ok() ? st : x.status();
    if (st.ok()) st = timed(get, SecondsSince(t0));
    if (st.ok() && std::memcmp(src, dst, span) != 0) {
      st = Status::Internal("a value read back from the store differs");
    }
    if (st.ok() && b % 2 == 0) st = timed(eng_r, engine.value().Batch(Op::kRead, dst_bufs, b));
    if (st.ok()) st = timed(mem_r, memcpy_batch(false, b));
    if (st.ok()) st = timed(red_get, redis.value()->Get(keys, dst_spans));
    if (!st.ok()) return Fail(st);
  }
  const double exists_ops = MetadataRate(all_keys, a.metadata_seconds, [&](const auto& keys) {
    for (const auto& st : s.BatchExists(keys)) {
      if (!st.ok()) return false;
    }
    return true;
  });
  const double locate_ops = MetadataRate(all_keys, a.metadata_seconds, [&](const auto& keys) {
    for (const auto& r : s.BatchLocate(keys)) {
      if (!r.ok()) return false;
    }
    return true;
  });
  const double engine_w = Gbps(total, eng_w.seconds), engine_r = Gbps(total, eng_r.seconds);
  const double redis_put = Gbps(total, red_set.seconds), redis_get = Gbps(total, red_get.seconds);
  const double put_gbps = Gbps(total, put.seconds), get_gbps = Gbps(total, get.seconds);
  const double memcpy_w = Gbps(total, mem_w.seconds), memcpy_r = Gbps(total, mem_r.seconds);
  nlohmann::json j = {
      {"value_size", a.value_size},
      {"values", values},
      {"batch", a.batch},
      {"catalog_sync_ms", a.catalog_sync_ms},
      {"reserve_bytes", a.reserve_bytes},
      {"nodes", a.nodes},
      {"transport", a.attach ? "attach" : a.transport},
      {"attach", a.attach},
      {"master_in_node", a.master_in_node},
      {"put_gbps", put_gbps},
      {"get_gbps", get_gbps},
      {"put_ops", values / put.seconds},
      {"get_ops", values / get.seconds},
      {"put_batch_p50_ms", Percentile(put.batch_ms, 0.5)},
      {"put_batch_p99_ms", Percentile(put.batch_ms, 0.99)},
      {"get_batch_p50_ms", Percentile(get.batch_ms, 0.5)},
      {"get_batch_p99_ms", Percentile(get.batch_ms, 0.99)},
      {"engine_gbps", engine_w},
      {"engine_read_gbps", engine_r},
      {"put_vs_engine", put_gbps / engine_w},
      {"get_vs_engine", get_gbps / engine_r},
      {"memcpy_gbps", memcpy_w},
      {"memcpy_read_gbps", memcpy_r},
      {"put_vs_memcpy", put_gbps / memcpy_w},
      {"get_vs_memcpy", get_gbps / memcpy_r},
      {"redis_put_gbps", redis_put},
      {"redis_get_gbps", redis_get},
      {"put_vs_redis", put_gbps / redis_put},
      {"get_vs_redis", get_gbps / redis_get},
      {"exists_ops", exists_ops},
      {"locate_ops", locate_ops},
  };
  std::printf("ferry bench store: %d values of %llu bytes, batches of %d, %d node(s), %s\n", values,
              static_cast<unsigned long long>(a.value_size), a.batch, a.nodes,
              a.attach ? "attached" : a.transport.c_str());
  std::printf("  %-6s %8s %10s %12s %12s %10s %10s %10s\n", "op", "GB/s", "ops/s", "p50 ms/batch",
              "p99 ms/batch", "engine", "memcpy", "redis");
  std::printf("  %-6s %8.2f %10.0f %12.2f %12.2f %10.2f %10.2f %10.2f\n", "put", put_gbps,
              values / put.seconds, j["put_batch_p50_ms"].get<double>(),
              j["put_batch_p99_ms"].get<double>(), engine_w, memcpy_w, redis_put);
  std::printf("  %-6s %8.2f %10.0f %12.2f %12.2f %10.2f %10.2f %10.2f\n", "get", get_gbps,
              values / get.seconds, j["get_batch_p50_ms"].get<double>(),
              j["get_batch_p99_ms"].get<double>(), engine_r, memcpy_r, redis_get);
  std::printf(
      "  ratios: put/engine %.2f, get/engine %.2f, put/memcpy %.2f, get/memcpy %.2f, "
      "put/redis %.2f, get/redis %.2f\n",
      put_gbps / engine_w, get_gbps / engine_r, put_gbps / memcpy_w, get_gbps / memcpy_r,
      put_gbps / redis_put, get_gbps / redis_get);
  std::printf("  metadata (batches of %zu): exists %.0f/s, get-locations %.0f/s\n", kMetadataBatch,
              exists_ops, locate_ops);
  if (a.json) std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace ferry::cli
