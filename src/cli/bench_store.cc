// `ferry bench store`: batch put and get through a master and node processes,
// next to what the same bytes cost through the bare engine (tcp, the same
// batches, measured in the same run) and through Redis SET/GET (4 pipelined
// connections). Also the master's metadata rate: exists and get-locations in
// batches of 128.
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_util.h"
#include "cli/cli.h"
#include "cli/local_cluster.h"
#include "cli/redis_reference.h"
#include "common/clock.h"
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

// The engine alone: the same batches written to, then read from, a `ferry
// serve` peer over the same transport.
Result<std::pair<double, double>> EngineReference(const BenchStoreArgs& a, uint8_t* src,
                                                  uint8_t* dst, int batches) {
  const uint64_t span = a.value_size * static_cast<uint64_t>(a.batch);
  FERRY_ASSIGN_OR_RETURN(
      auto peer, Subprocess::Spawn({SelfExe(), "serve", "--alloc", std::to_string(span)}, true));
  FERRY_ASSIGN_OR_RETURN(std::string line, peer->ReadLine(std::chrono::seconds(20)));
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.contains("alloc")) {
    return Status(StatusCode::kInternal, "serve said: " + line);
  }
  EngineOptions eo;
  eo.transport = a.transport == "tcp" ? "tcp" : "";
  FERRY_ASSIGN_OR_RETURN(auto engine, Engine::Create(eo));
  FERRY_ASSIGN_OR_RETURN(SegmentId seg, engine->OpenSegment(j["segment"].get<std::string>()));
  const uint64_t remote = j["alloc"]["addr"];
  double secs[2] = {0, 0};
  for (Op op : {Op::kWrite, Op::kRead}) {
    std::vector<Request> reqs;
    for (int i = 0; i < a.batch; ++i) {
      const uint64_t off = a.value_size * static_cast<uint64_t>(i);
      reqs.push_back({op, (op == Op::kWrite ? src : dst) + off, seg, remote + off, a.value_size});
    }
    auto t0 = Clock::now();
    for (int b = 0; b < batches; ++b) {
      FERRY_ASSIGN_OR_RETURN(auto batch, engine->Submit(reqs));
      FERRY_RETURN_IF_ERROR(batch->Wait(std::chrono::seconds(60)));
    }
    secs[op == Op::kWrite ? 0 : 1] = SecondsSince(t0);
  }
  (void)peer->Signal(SIGTERM);
  (void)peer->Wait(std::chrono::seconds(5));
  const uint64_t bytes = span * static_cast<uint64_t>(batches);
  return std::make_pair(Gbps(bytes, secs[0]), Gbps(bytes, secs[1]));
}

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
  const int batches = (a.values + a.batch - 1) / a.batch;
  const int values = batches * a.batch;  // whole batches
  const uint64_t span = a.value_size * static_cast<uint64_t>(a.batch);
  const uint64_t total = a.value_size * static_cast<uint64_t>(values);
  // Nodes hold every value with room to spare, so nothing is evicted.
  const uint64_t per_node = (total / static_cast<uint64_t>(a.nodes)) * 5 / 4 + (16ull << 20);

  auto master = SpawnMaster(SelfExe(), {"--http-port", "-1"});
  if (!master.ok()) return Fail(master.status());
  std::vector<NodeProcess> nodes;
  for (int i = 0; i < a.nodes; ++i) {
    auto n =
        SpawnNode(SelfExe(), master.value().address, {"--segment-size", std::to_string(per_node)});
    if (!n.ok()) return Fail(n.status());
    nodes.push_back(std::move(n).value());
  }
  StoreOptions so;
  so.master = master.value().address;
  so.local_memory = 0;  // every byte crosses to a node process
  so.engine.transport = a.transport == "tcp" ? "tcp" : "";
  auto store = Store::Create(so);
  if (!store.ok()) return Fail(store.status());
  Store& s = *store.value();

  // One registered source and destination area of a batch; value k of a batch
  // has its own pattern, so a misplaced value is caught.
  std::vector<uint8_t> src(span), dst(span);
  for (uint64_t i = 0; i < span; ++i) src[i] = static_cast<uint8_t>((i * 131) ^ (i >> 12));
  if (Status st = s.RegisterBuffer(src.data(), span); !st.ok()) return Fail(st);
  if (Status st = s.RegisterBuffer(dst.data(), span); !st.ok()) return Fail(st);
  std::vector<StoreBuffer> src_bufs, dst_bufs;
  for (int k = 0; k < a.batch; ++k) {
    const uint64_t off = a.value_size * static_cast<uint64_t>(k);
    src_bufs.push_back({src.data() + off, a.value_size});
    dst_bufs.push_back({dst.data() + off, a.value_size});
  }
  std::vector<std::string> all_keys;
  auto keys_of = [&](int b) {
    std::vector<std::string> keys;
    for (int k = 0; k < a.batch; ++k) keys.push_back("bench/" + std::to_string(b * a.batch + k));
    return keys;
  };

  Phase put, get;
  for (int b = 0; b < batches; ++b) {
    auto keys = keys_of(b);
    auto t0 = Clock::now();
    auto st = s.BatchPutFrom(keys, src_bufs);
    const double secs = SecondsSince(t0);
    for (const auto& x : st) {
      if (!x.ok()) return Fail(x);
    }
    put.seconds += secs;
    put.batch_ms.push_back(secs * 1e3);
    all_keys.insert(all_keys.end(), keys.begin(), keys.end());
  }
  for (int b = 0; b < batches; ++b) {
    auto keys = keys_of(b);
    std::memset(dst.data(), 0, span);
    auto t0 = Clock::now();
    auto got = s.BatchGetInto(keys, dst_bufs);
    const double secs = SecondsSince(t0);
    for (const auto& x : got) {
      if (!x.ok()) return Fail(x.status());
    }
    if (std::memcmp(src.data(), dst.data(), span) != 0) {
      return Fail(Status(StatusCode::kInternal, "a value read back differs"));
    }
    get.seconds += secs;
    get.batch_ms.push_back(secs * 1e3);
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
  store.value().reset();
  nodes.clear();
  master.value().proc.reset();

  auto engine = EngineReference(a, src.data(), dst.data(), batches);
  if (!engine.ok()) return Fail(engine.status());

  double redis_put = 0, redis_get = 0;
  {
    auto redis = RedisReference::Start(kRedisConnections);
    if (!redis.ok()) return Fail(redis.status());
    double set_s = 0, get_s = 0;
    for (int b = 0; b < batches; ++b) {
      auto keys = keys_of(b);
      std::vector<std::span<const uint8_t>> vals;
      std::vector<std::span<uint8_t>> outs;
      for (int k = 0; k < a.batch; ++k) {
        vals.emplace_back(static_cast<const uint8_t*>(src_bufs[k].data), a.value_size);
        outs.emplace_back(static_cast<uint8_t*>(dst_bufs[k].data), a.value_size);
      }
      auto t = redis.value()->Set(keys, vals);
      if (!t.ok()) return Fail(t.status());
      set_s += t.value();
      t = redis.value()->Get(keys, outs);
      if (!t.ok()) return Fail(t.status());
      get_s += t.value();
    }
    redis_put = Gbps(total, set_s);
    redis_get = Gbps(total, get_s);
  }

  const double put_gbps = Gbps(total, put.seconds), get_gbps = Gbps(total, get.seconds);
  const auto [engine_w, engine_r] = engine.value();
  nlohmann::json j = {
      {"value_size", a.value_size},
      {"values", values},
      {"batch", a.batch},
      {"nodes", a.nodes},
      {"transport", a.transport},
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
      {"redis_put_gbps", redis_put},
      {"redis_get_gbps", redis_get},
      {"put_vs_redis", put_gbps / redis_put},
      {"get_vs_redis", get_gbps / redis_get},
      {"exists_ops", exists_ops},
      {"locate_ops", locate_ops},
  };
  std::printf("ferry bench store: %d values of %llu bytes, batches of %d, %d node(s), %s\n", values,
              static_cast<unsigned long long>(a.value_size), a.batch, a.nodes, a.transport.c_str());
  std::printf("  %-6s %8s %10s %12s %12s %10s %10s\n", "op", "GB/s", "ops/s", "p50 ms/batch",
              "p99 ms/batch", "engine", "redis");
  std::printf("  %-6s %8.2f %10.0f %12.2f %12.2f %10.2f %10.2f\n", "put", put_gbps,
              values / put.seconds, j["put_batch_p50_ms"].get<double>(),
              j["put_batch_p99_ms"].get<double>(), engine_w, redis_put);
  std::printf("  %-6s %8.2f %10.0f %12.2f %12.2f %10.2f %10.2f\n", "get", get_gbps,
              values / get.seconds, j["get_batch_p50_ms"].get<double>(),
              j["get_batch_p99_ms"].get<double>(), engine_r, redis_get);
  std::printf("  ratios: put/engine %.2f, get/engine %.2f, put/redis %.2f, get/redis %.2f\n",
              put_gbps / engine_w, get_gbps / engine_r, put_gbps / redis_put, get_gbps / redis_get);
  std::printf("  metadata (batches of %zu): exists %.0f/s, get-locations %.0f/s\n", kMetadataBatch,
              exists_ops, locate_ops);
  if (a.json) std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace ferry::cli
