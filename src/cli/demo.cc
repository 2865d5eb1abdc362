// `ferry demo`: starts a peer process and moves data through every transport,
// verifying each byte. Needs no server or configuration.
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/cli.h"
#include "cli/local_cluster.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "ferry/engine.h"
#include "ferry/store.h"

namespace ferry::cli {
namespace {

void Fill(char* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<char>(x >> (8 * (i % 8)));
}

struct Moved {
  double write_gbps = 0;
  double read_gbps = 0;
  // The first round alone: where the target's memory is fresh, it includes
  // faulting its pages in, which later rounds do not pay.
  double first_write_gbps = 0;
  double first_read_gbps = 0;
};

// Writes `total` bytes to the peer in batches of 64 MiB requests, reads them
// back, and compares every byte. The first round is timed on its own, and
// the figures are those of the rounds after it (one at least).
Result<Moved> RoundTrips(Engine& e, SegmentId seg, uint64_t remote, uint64_t buffer, uint64_t total,
                         std::string_view expect) {
  std::vector<char> src(buffer), dst(buffer);
  const uint64_t block = std::min<uint64_t>(buffer, 64ull << 20);
  Moved m;
  double wsecs = 0, rsecs = 0;
  uint64_t moved = 0, timed = 0;
  for (uint64_t round = 0; moved < total || round < 2; ++round) {
    Fill(src.data(), buffer, round + 1);
    std::memset(dst.data(), 0, buffer);
    for (Op op : {Op::kWrite, Op::kRead}) {
      std::vector<Request> reqs;
      for (uint64_t off = 0; off < buffer; off += block) {
        char* local = (op == Op::kWrite ? src.data() : dst.data()) + off;
        reqs.push_back({op, local, seg, remote + off, std::min(block, buffer - off)});
      }
      auto t0 = Clock::now();
      auto b = e.Submit(reqs);
      if (!b.ok()) return b.status();
      FERRY_RETURN_IF_ERROR(b.value()->Wait(std::chrono::seconds(120)));
      (op == Op::kWrite ? wsecs : rsecs) += SecondsSince(t0);
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (b.value()->Result(i).transport != expect) {
          return Status::Internal("served by " + std::string(b.value()->Result(i).transport));
        }
      }
    }
    if (std::memcmp(src.data(), dst.data(), buffer) != 0) {
      return Status::Internal("read-back differs in round " + std::to_string(round));
    }
    moved += buffer;
    if (round == 0) {
      m.first_write_gbps = static_cast<double>(buffer) / wsecs / 1e9;
      m.first_read_gbps = static_cast<double>(buffer) / rsecs / 1e9;
      wsecs = rsecs = 0;
    } else {
      timed += buffer;
    }
  }
  m.write_gbps = static_cast<double>(timed) / wsecs / 1e9;
  m.read_gbps = static_cast<double>(timed) / rsecs / 1e9;
  return m;
}

// A master and two nodes in their own processes, and a client here that puts
// keys of many sizes with two replicas, reads them back and checks each byte.
Status StoreDemo() {
  std::printf("ferry demo: store (a master, two nodes, a client; loopback)\n");
  FERRY_ASSIGN_OR_RETURN(auto master, SpawnMaster(SelfExe(), {"--http-port", "-1"}));
  std::vector<NodeProcess> nodes;
  for (int i = 0; i < 2; ++i) {
    FERRY_ASSIGN_OR_RETURN(auto n,
                           SpawnNode(SelfExe(), master.address, {"--segment-size", "64MiB"}));
    nodes.push_back(std::move(n));
  }
  StoreOptions o;
  o.master = master.address;
  o.local_memory = 0;  // a pure client: every byte crosses a process boundary
  o.replicas = 2;
  FERRY_ASSIGN_OR_RETURN(auto store, Store::Create(o));
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> values;
  uint64_t total = 0;
  for (uint64_t size : {1ull, 100ull, 4096ull, 65537ull, 1ull << 20, 8ull << 20}) {
    keys.push_back("demo/" + std::to_string(size));
    values.emplace_back(size);
    Fill(reinterpret_cast<char*>(values.back().data()), size, size);
    total += size;
  }
  std::vector<std::span<const uint8_t>> spans(values.begin(), values.end());
  auto t0 = Clock::now();
  for (const Status& st : store->BatchPut(keys, spans)) FERRY_RETURN_IF_ERROR(st);
  const double put_s = SecondsSince(t0);
  t0 = Clock::now();
  auto got = store->BatchGet(keys);
  const double get_s = SecondsSince(t0);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!got[i].ok()) return got[i].status();
    if (got[i].value() != values[i]) return Status::Internal(keys[i] + " differs");
    auto loc = store->Locate(keys[i]);
    if (!loc.ok()) return loc.status();
    if (loc.value().replicas.size() != 2 ||
        loc.value().replicas[0].extents[0].segment == loc.value().replicas[1].extents[0].segment) {
      return Status::Internal(keys[i] + ": replicas not on two nodes");
    }
  }
  for (const Status& st : store->BatchRemove(keys, /*force=*/true)) FERRY_RETURN_IF_ERROR(st);
  if (store->Exists(keys[0]).code() != StatusCode::kNotFound) {
    return Status::Internal("a removed key still exists");
  }
  std::printf(
      "  %zu keys, 1 B to 8 MiB, 2 replicas on nodes %s and %s: put %.1f ms, get %.1f ms "
      "(%.2f MB), every byte verified\n",
      keys.size(), nodes[0].segment.c_str(), nodes[1].segment.c_str(), put_s * 1e3, get_s * 1e3,
      static_cast<double>(total) / 1e6);
  return Status::Ok();
}

}  // namespace

int Demo(const DemoArgs& args) {
  std::printf("ferry demo: a peer process, %llu MiB written and read back per transport\n",
              static_cast<unsigned long long>(args.bytes >> 20));
  auto peer =
      Subprocess::Spawn({SelfExe(), "serve", "--alloc", std::to_string(args.buffer) + "B"}, true);
  if (!peer.ok()) {
    std::fprintf(stderr, "demo: %s\n", peer.status().ToString().c_str());
    return 1;
  }
  auto line = peer.value()->ReadLine(std::chrono::seconds(30));
  if (!line.ok()) {
    std::fprintf(stderr, "demo: the peer did not start: %s\n", line.status().ToString().c_str());
    return 1;
  }
  auto j = nlohmann::json::parse(line.value(), nullptr, false);
  if (j.is_discarded() || !j.contains("alloc")) {
    std::fprintf(stderr, "demo: unexpected peer output: %s\n", line.value().c_str());
    return 1;
  }
  const std::string peer_name = j["segment"];
  const uint64_t peer_buf = j["alloc"]["addr"];

  struct Case {
    const char* transport;
    std::string_view kind;  // the transport that must serve it
  };
  int failures = 0;
  for (Case c : {Case{"tcp", "tcp"}, Case{"shm", "shm"}, Case{"local", "local"}}) {
    EngineOptions o;
    o.transport = c.kind == "local" ? "" : c.transport;
    auto e = Engine::Create(o);
    if (!e.ok()) {
      std::fprintf(stderr, "demo: %s\n", e.status().ToString().c_str());
      return 1;
    }
    std::string name = peer_name;
    uint64_t remote = peer_buf;
    if (c.kind == "local") {
      auto mem = e.value()->AllocateMemory(args.buffer);
      if (!mem.ok()) return 1;
      name = e.value()->name();
      remote = reinterpret_cast<uint64_t>(mem.value());
    }
    auto seg = e.value()->OpenSegment(name);
    Result<Moved> r =
        seg.ok() ? RoundTrips(*e.value(), seg.value(), remote, args.buffer, args.bytes, c.kind)
                 : Result<Moved>(seg.status());
    if (r.ok()) {
      std::printf(
          "  %-5s  write %6.2f GB/s  read %6.2f GB/s  every byte verified "
          "(first pass: %.2f / %.2f)\n",
          c.transport, r.value().write_gbps, r.value().read_gbps, r.value().first_write_gbps,
          r.value().first_read_gbps);
    } else {
      ++failures;
      std::printf("  %-5s  FAILED: %s\n", c.transport, r.status().ToString().c_str());
    }
  }
  (void)peer.value()->Signal(SIGTERM);
  (void)peer.value()->Wait(std::chrono::seconds(10));
  if (Status st = StoreDemo(); !st.ok()) {
    ++failures;
    std::printf("  store  FAILED: %s\n", st.ToString().c_str());
  }
  std::printf(failures == 0 ? "demo: OK\n" : "demo: FAILED\n");
  return failures == 0 ? 0 : 1;
}

}  // namespace ferry::cli
