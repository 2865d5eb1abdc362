// `ferry bench transfer`: engine throughput and latency, next to the physical
// reference measured in the same run between the same two processes: plain
// TCP streams of the same bytes for tcp (and, for GPU memory, the same
// streams staging it by hand), a single-thread memcpy of the same block size
// for shm.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cli/bench_util.h"
#include "cli/cli.h"
#include "cli/transfer_reference.h"
#include "common/cache.h"
#include "common/clock.h"
#include "common/cpu_quota.h"
#include "common/env.h"
#include "common/subprocess.h"
#include "common/thread_name.h"
#include "ferry/engine.h"
#include "gpu/gpu.h"

namespace ferry::cli {
namespace {

// The bench's host buffer of `bytes` on `e`: engine-allocated, or with
// --memory heap anonymous memory advised to huge pages (where the kernel's
// transparent_hugepage setting is madvise or always), registered.
Result<void*> HostBuffer(Engine& e, const BenchArgs& a, uint64_t bytes) {
  if (a.memory != "heap") return e.AllocateMemory(bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::ResourceExhausted("mmap of the bench buffer failed");
  madvise(p, bytes, MADV_HUGEPAGE);
  Status st = e.RegisterMemory(p, bytes);
  if (!st.ok()) {
    munmap(p, bytes);
    return st;
  }
  return p;
}

uint64_t RegionBytes(const BenchArgs& a) {
  return a.block_size * static_cast<uint64_t>(a.batch_size) * static_cast<uint64_t>(a.threads);
}

int RunTarget(const BenchArgs& a, uint64_t bytes) {
  auto engine = StartServingEngine("bench target", a.host, a.port, "");
  if (!engine) return 1;
  // The target holds the destination of a write and the source of a read.
  const int gpu = a.op == "write" ? a.gpu_dst : a.gpu_src;
  Result<void*> mem = Status::Internal("unset");
  if (gpu >= 0) {
    mem = gpu::AllocDevice(bytes, gpu);
    if (mem.ok()) {
      Status st = engine->RegisterMemory(mem.value(), bytes);
      if (!st.ok()) mem = st;
    }
  } else {
    mem = HostBuffer(*engine, a, bytes);
  }
  if (!mem.ok()) {
    std::fprintf(stderr, "bench target: %s\n", mem.status().ToString().c_str());
    return 1;
  }
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, a.host.c_str(), &addr.sin_addr);
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(lfd, 64) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("bench target: reference socket");
    return 1;
  }
  // --fresh: memory nobody has touched, set up the way a user would: over
  // tcp plain anonymous memory, registered; otherwise engine-allocated. The
  // state outlives this frame for the detached reference threads; once
  // closed, they set up nothing.
  struct Fresh {
    std::mutex mu;
    void* mem = nullptr;
    uint64_t bytes = 0;
    bool closed = false;
  };
  auto state = std::make_shared<Fresh>();
  Engine* eng = engine.get();
  const bool heap = a.transport == "tcp";
  auto release = [state, eng, heap] {
    if (state->mem == nullptr) return;
    if (heap) {
      (void)eng->UnregisterMemory(state->mem);
      munmap(state->mem, state->bytes);
    } else {
      (void)eng->FreeMemory(state->mem);
    }
    state->mem = nullptr;
  };
  FreshSource fresh = [state, eng, heap, gpu, release](uint64_t n) -> uint64_t {
    std::lock_guard lk(state->mu);
    if (state->closed) return 0;
    release();
    if (gpu >= 0) return 0;  // host memory only
    if (heap) {
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return 0;
      if (!eng->RegisterMemory(p, n).ok()) {
        munmap(p, n);
        return 0;
      }
      state->mem = p;
    } else {
      auto p = eng->AllocateMemory(n);
      if (!p.ok()) return 0;
      state->mem = p.value();
    }
    state->bytes = n;
    return reinterpret_cast<uint64_t>(state->mem);
  };
  std::thread(ServeReference, lfd, fresh, gpu).detach();
  std::printf("TARGET %s %u\n", engine->name().c_str(), ntohs(addr.sin_port));
  std::fflush(stdout);
  WaitForStopSignal();
  shutdown(lfd, SHUT_RDWR);
  std::lock_guard lk(state->mu);
  release();
  state->closed = true;
  return 0;
}

// The GPU's link and the raw streams of host memory at once: what each
// leaves the other of the host's memory and PCIe, which a staged path makes
// them share. The link's copies walk a staging pool's worth of page-locked
// memory (the initiator's default pool, 64 MiB), first alone for a second.
// With GPU memory at the destination, also copies in from blocks the CPU has
// just written, as landings are, written back or not (`in_written*`). GB/s;
// all 0 when any part cannot run.
struct LinkShare {
  double alone = 0, beside = 0, streams = 0, in_written_back = 0, in_written = 0;
};
LinkShare LinkBesideStreams(const BenchArgs& a, const std::string& host, uint64_t total,
                            int streams, const RefMemory& mem) {
  constexpr size_t kPoolSpan = 64u << 20;
  const size_t block = std::max<uint64_t>(a.block_size, 1u << 20);
  auto alone = gpu::StagingBandwidth(a.gpu_src, a.gpu_dst, block, 1.0, kPoolSpan);
  if (!alone.ok()) return {};
  std::atomic<int> phase{0};  // 0 setting up, 1 copying, 2 done
  double link = 0, tcp = 0;
  std::thread copies([&] {
    auto r = gpu::StagingBandwidth(a.gpu_src, a.gpu_dst, block, 0, kPoolSpan, [&phase] {
      int setting_up = 0;
      phase.compare_exchange_strong(setting_up, 1);
      return phase.load() != 2;
    });
    link = r.ok() ? r.value() : 0;
    phase.store(2);
  });
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (phase.load() == 0 && Clock::now() < deadline) std::this_thread::sleep_for(Millis(1));
  if (phase.load() == 1)
    tcp = ReferenceTcp(host, a.ref_port, a.op == "write", total, a.block_size, streams, mem);
  phase.store(2);
  copies.join();
  if (tcp == 0 || link == 0) return {};
  LinkShare share{alone.value(), link, tcp};
  if (a.gpu_dst >= 0) {
    auto back = gpu::CopyInFromWrittenBandwidth(a.gpu_dst, block, 0.5, true);
    auto dirty = gpu::CopyInFromWrittenBandwidth(a.gpu_dst, block, 0.5, false);
    if (back.ok() && dirty.ok()) {
      share.in_written_back = back.value();
      share.in_written = dirty.value();
    }
  }
  return share;
}

int RunInitiator(const BenchArgs& a) {
  EngineOptions o;
  o.host = a.host;
  o.transport = a.transport == "auto" ? "" : a.transport;
  auto er = Engine::Create(o);
  if (!er.ok()) {
    std::fprintf(stderr, "bench initiator: %s\n", er.status().ToString().c_str());
    return 1;
  }
  Engine& e = *er.value();
  auto seg = e.OpenSegment(a.peer);
  if (!seg.ok()) {
    std::fprintf(stderr, "bench initiator: %s\n", seg.status().ToString().c_str());
    return 1;
  }
  auto info = e.GetSegmentInfo(seg.value());
  const uint64_t per_thread = a.block_size * static_cast<uint64_t>(a.batch_size);
  if (!info.ok() || info.value().buffers.empty() ||
      info.value().buffers[0].length < per_thread * static_cast<uint64_t>(a.threads)) {
    std::fprintf(stderr, "bench initiator: the target exposes no buffer large enough\n");
    return 1;
  }
  const uint64_t remote = info.value().buffers[0].addr;
  const Op op = a.op == "write" ? Op::kWrite : Op::kRead;
  const uint64_t local_bytes = per_thread * static_cast<uint64_t>(a.threads);
  const int local_gpu = op == Op::kWrite ? a.gpu_src : a.gpu_dst;
  Result<void*> local = Status::Internal("unset");
  if (local_gpu >= 0) {
    local = gpu::AllocDevice(local_bytes, local_gpu);
    if (local.ok()) {
      Status st = e.RegisterMemory(local.value(), local_bytes);
      if (!st.ok()) local = st;
    }
  } else {
    local = HostBuffer(e, a, local_bytes);
    if (local.ok()) std::memset(local.value(), 7, local_bytes);
  }
  if (!local.ok()) {
    std::fprintf(stderr, "bench initiator: %s\n", local.status().ToString().c_str());
    return 1;
  }
  char* lbase = static_cast<char*>(local.value());

  // How fast bytes cross between CPUs, before the engine's phase and after
  // the references: a guest whose vCPUs the host moves apart slows them all.
  constexpr double kCrossCpuSeconds = 0.2;
  const double cross_before = ReferenceCrossCpu(kCrossCpuSeconds);

  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::vector<double>> lat(static_cast<size_t>(a.threads));
  std::vector<uint64_t> moved(static_cast<size_t>(a.threads), 0);
  std::vector<std::string> kind(static_cast<size_t>(a.threads));
  std::vector<std::thread> workers;
  auto t0 = Clock::now();
  for (int t = 0; t < a.threads; ++t) {
    workers.emplace_back([&, t] {
      NameThisThread("bench-worker");
      std::vector<Request> reqs(static_cast<size_t>(a.batch_size));
      for (int i = 0; i < a.batch_size; ++i) {
        uint64_t off =
            static_cast<uint64_t>(t) * per_thread + static_cast<uint64_t>(i) * a.block_size;
        reqs[static_cast<size_t>(i)] = {op, lbase + off, seg.value(), remote + off, a.block_size};
      }
      while (!stop.load(std::memory_order_relaxed)) {
        auto s0 = Clock::now();
        auto b = e.Submit(reqs);
        Status st = b.ok() ? b.value()->Wait(std::chrono::seconds(60)) : b.status();
        if (!st.ok()) {
          if (errors.fetch_add(1) == 0) std::fprintf(stderr, "bench: %s\n", st.ToString().c_str());
          break;
        }
        lat[static_cast<size_t>(t)].push_back(SecondsSince(s0) * 1e6);
        moved[static_cast<size_t>(t)] += per_thread;
        if (kind[static_cast<size_t>(t)].empty()) {
          kind[static_cast<size_t>(t)] = b.value()->Result(0).transport;
        }
      }
    });
  }
  while (SecondsSince(t0) < a.duration && errors.load() == 0) {
    std::this_thread::sleep_for(Millis(5));
  }
  stop = true;
  for (auto& w : workers) w.join();
  const double secs = SecondsSince(t0);
  if (errors.load() > 0) return 1;

  uint64_t total = 0;
  std::vector<double> all;
  for (int t = 0; t < a.threads; ++t) {
    total += moved[static_cast<size_t>(t)];
    all.insert(all.end(), lat[static_cast<size_t>(t)].begin(), lat[static_cast<size_t>(t)].end());
  }
  const double gbps = static_cast<double>(total) / secs / 1e9;
  const double ops = static_cast<double>(total / a.block_size) / secs;
  const double p50 = Percentile(all, 0.50), p99 = Percentile(all, 0.99);
  const std::string served = kind[0];

  std::string ref_name;
  double ref = 0, ref_each = 0, ref_staged = 0, ref_batched = 0, ref_link = 0;
  nlohmann::json staged_variants = nlohmann::json::array();
  LinkShare share;
  int ref_streams = 0;
  // Over tcp, GPU memory included, the bound is the socket; otherwise the copy.
  if (served == "tcp") {
    // The lanes, as the initiator's engine took them from the same variable
    // (engine.cc, ApplyEnv), which it has checked to be a number of at least 1.
    ref_streams = EffectiveTcpLanes(
        static_cast<int>(env::GetInt("FERRY_TCP_LANES", EngineOptions{}.tcp_lanes).value()));
    ref_name = "tcp_streams";
    uint64_t peer_host_end = a.peer.rfind(':');
    // --ref-spread: the streams share out the bytes the engine's batches touch.
    RefMemory mem;
    mem.spread = a.ref_spread ? local_bytes / static_cast<uint64_t>(ref_streams) : 0;
    const std::string ref_host = a.peer.substr(0, peer_host_end);
    ref =
        ReferenceTcp(ref_host, a.ref_port, op == Op::kWrite, total, a.block_size, ref_streams, mem);
    // GPU memory at either end: the same streams, each end with GPU memory
    // staging it by hand, is what the hardware gives such a program.
    if (a.gpu_src >= 0 || a.gpu_dst >= 0) {
      mem.device = local_gpu;
      mem.staged = true;
      ref_staged = ReferenceTcp(ref_host, a.ref_port, op == Op::kWrite, total, a.block_size,
                                ref_streams, mem);
      if (a.ref_staged_variants) {
        for (const StagedVariant& v : ReferenceStagedVariants(
                 ref_host, a.ref_port, op == Op::kWrite, total, a.block_size, ref_streams, mem)) {
          staged_variants.push_back(
              {{"write_back", v.write_back}, {"piece_kib", v.piece_kib}, {"gbps", v.gbps}});
        }
      }
      // And the GPU's link alone, its copies as big as the engine's chunks
      // at least: the most any staged path could move.
      auto link =
          gpu::StagingBandwidth(a.gpu_src, a.gpu_dst, std::max<uint64_t>(a.block_size, 1u << 20),
                                std::min(a.duration, 2.0));
      ref_link = link.ok() ? link.value() : 0;
      RefMemory host_mem;
      host_mem.spread = mem.spread;
      share = LinkBesideStreams(a, ref_host, total, ref_streams, host_mem);
    } else if (a.threads == 1) {
      // Host memory: the same streams with the engine's batch boundaries,
      // each batch confirmed before the next, which no stream of bytes pays.
      // (Several submitting threads overlap their batches' boundaries.)
      ref_batched = ReferenceTcp(ref_host, a.ref_port, op == Op::kWrite, total, a.block_size,
                                 ref_streams, mem, local_bytes);
    }
  } else if (a.gpu_src >= 0 || a.gpu_dst >= 0) {
    ref_name = "cudaMemcpyAsync";
    auto r = gpu::CopyBandwidth(a.gpu_src, a.gpu_dst, a.block_size, std::min(a.duration, 2.0));
    ref = r.ok() ? r.value() : 0;
    // A batch of one is a copy seen complete before the next is issued: so
    // is this second reference, each copy synchronized alone.
    if (a.batch_size == 1 && a.threads == 1) {
      auto each =
          gpu::CopyBandwidth(a.gpu_src, a.gpu_dst, a.block_size, std::min(a.duration, 2.0), 1);
      ref_each = each.ok() ? each.value() : 0;
    }
  } else {
    ref_name = "memcpy";
    ref = ReferenceMemcpy(a.block_size, std::min(a.duration, 2.0));
  }
  const double ratio = ref > 0 ? gbps / ref : 0;
  const double cross_after = ReferenceCrossCpu(kCrossCpuSeconds);

  // --fresh: single passes over target memory set up just before each, timed
  // from submit to completion. The set-up (the target's allocation or
  // registration, and this engine's following of it) is not timed: it is
  // where first-touch costs belong.
  std::vector<double> fresh;
  for (int i = 0; i < a.fresh; ++i) {
    const uint64_t at = AskFresh(a.peer.substr(0, a.peer.rfind(':')), a.ref_port, local_bytes);
    if (at == 0) {
      std::fprintf(stderr, "bench: the target set up no fresh memory (host memory only)\n");
      return 1;
    }
    // Same-host engines follow the registration in the background; wait for
    // that as a user's next step would, up to 5 s (a remote peer's is
    // fetched by the submit).
    for (int w = 0; w < 5000; ++w) {
      auto info = e.GetSegmentInfo(seg.value());
      if (info.ok() && std::any_of(info.value().buffers.begin(), info.value().buffers.end(),
                                   [&](const BufferInfo& b) { return b.addr == at; })) {
        break;
      }
      std::this_thread::sleep_for(Millis(1));
    }
    std::vector<Request> reqs;
    for (uint64_t off = 0; off < local_bytes; off += a.block_size) {
      reqs.push_back({op, lbase + off, seg.value(), at + off, a.block_size});
    }
    auto s0 = Clock::now();
    auto b = e.Submit(reqs);
    Status st = b.ok() ? b.value()->Wait(std::chrono::seconds(60)) : b.status();
    if (!st.ok()) {
      std::fprintf(stderr, "bench: fresh pass: %s\n", st.ToString().c_str());
      return 1;
    }
    fresh.push_back(static_cast<double>(local_bytes) / SecondsSince(s0) / 1e9);
  }
  std::vector<double> fresh_sorted = fresh;
  const double fresh_gbps = Percentile(fresh_sorted, 0.5);

  std::printf("%-9s %-6s %12s %7s %7s %9s %12s %10s %10s %14s %8s\n", "transport", "op", "block",
              "batch", "threads", "GB/s", "ops/s", "p50_us", "p99_us", "reference GB/s", "ratio");
  std::printf("%-9s %-6s %12llu %7d %7d %9.3f %12.0f %10.1f %10.1f %14.3f %8.3f\n", served.c_str(),
              a.op.c_str(), static_cast<unsigned long long>(a.block_size), a.batch_size, a.threads,
              gbps, ops, p50, p99, ref, ratio);
  if (ref_streams > 0) {
    std::printf(
        "(latency is per batch; reference is %d raw TCP stream%s at once, one per "
        "engine lane)\n",
        ref_streams, ref_streams == 1 ? "" : "s");
  } else {
    std::printf("(latency is per batch; reference is %s)\n", ref_name.c_str());
  }
  const int parallel = cpus::Parallel();
  const int budget = cpus::Budget();
  const int online = static_cast<int>(std::thread::hardware_concurrency());
  if (parallel != online || budget != parallel) {
    std::printf(
        "(defaults sized for the CPUs this process may use: %d to run on, %d of CPU "
        "time, %d online)\n",
        parallel, budget, online);
  }
  if (ref_each > 0) {
    std::printf("each copy synchronized alone: %.3f GB/s, ratio %.3f\n", ref_each, gbps / ref_each);
  }
  if (ref_staged > 0) {
    std::printf("the same raw streams staging GPU memory by hand: %.3f GB/s, ratio %.3f\n",
                ref_staged, gbps / ref_staged);
  }
  if (ref_link > 0) {
    std::printf(
        "the GPU's link alone, the same bytes copied out of and into GPU memory at once: "
        "%.3f GB/s, ratio %.3f\n",
        ref_link, gbps / ref_link);
  }
  if (share.beside > 0) {
    std::printf(
        "the link over 64 MiB of host memory: %.3f GB/s alone; beside raw streams of host "
        "memory, %.3f GB/s while the streams moved %.3f\n",
        share.alone, share.beside, share.streams);
  }
  if (share.in_written > 0) {
    std::printf(
        "copies into the GPU from host blocks just written: %.3f GB/s, %.3f with the "
        "staging's write-back (mode %d)\n",
        share.in_written, share.in_written_back, DmaWriteBackMode());
  }
  if (ref_batched > 0) {
    std::printf(
        "the same raw streams, each batch confirmed before the next: %.3f GB/s, ratio %.3f\n",
        ref_batched, gbps / ref_batched);
  }
  if (cross_before > 0) {
    std::printf("bytes across two CPUs (64 KiB copies): %.2f GB/s before, %.2f after\n",
                cross_before, cross_after);
  }
  if (!fresh.empty()) {
    std::printf("fresh target memory, single passes: median %.3f GB/s over %zu, ratio %.3f\n",
                fresh_gbps, fresh.size(), ref > 0 ? fresh_gbps / ref : 0);
  }
  if (a.json) {
    nlohmann::json j = {{"transport", served},
                        {"op", a.op},
                        {"block_size", a.block_size},
                        {"batch_size", a.batch_size},
                        {"threads", a.threads},
                        {"gpu_src", a.gpu_src},
                        {"gpu_dst", a.gpu_dst},
                        {"duration_s", secs},
                        {"bytes", total},
                        {"gbps", gbps},
                        {"ops_per_s", ops},
                        {"p50_us", p50},
                        {"p99_us", p99},
                        {"reference", ref_name},
                        {"reference_streams", ref_streams},
                        {"reference_spread", a.ref_spread},
                        {"memory", a.memory},
                        {"reference_gbps", ref},
                        {"ratio", ratio},
                        {"io_threads", e.options().io_threads},
                        {"io_spin_us", e.options().io_spin_us},
                        {"cpus", parallel},
                        {"cpu_budget", budget},
                        {"cpus_online", online},
                        {"target_env", a.target_env},
                        {"initiator_env", a.initiator_env}};
    if (cross_before > 0) j["cross_cpu_gbps"] = {cross_before, cross_after};
    if (ref_each > 0) {
      j["reference_each_gbps"] = ref_each;
      j["ratio_each"] = gbps / ref_each;
    }
    if (ref_staged > 0) {
      j["reference_staged_gbps"] = ref_staged;
      j["ratio_staged"] = gbps / ref_staged;
    }
    if (!staged_variants.empty()) j["reference_staged_variants"] = staged_variants;
    if (ref_link > 0) {
      j["reference_link_gbps"] = ref_link;
      j["ratio_link"] = gbps / ref_link;
    }
    if (share.beside > 0) {
      j["link_pool_alone_gbps"] = share.alone;
      j["link_pool_beside_streams_gbps"] = share.beside;
      j["streams_beside_link_gbps"] = share.streams;
    }
    if (share.in_written > 0) {
      j["copy_in_written_gbps"] = share.in_written;
      j["copy_in_written_back_gbps"] = share.in_written_back;
      j["dma_write_back_mode"] = DmaWriteBackMode();
    }
    if (ref_batched > 0) {
      j["reference_batched_gbps"] = ref_batched;
      j["ratio_batched"] = gbps / ref_batched;
    }
    if (!fresh.empty()) {
      j["fresh_runs"] = fresh.size();
      j["fresh_gbps"] = fresh_gbps;
      j["fresh_gbps_all"] = fresh;
      j["fresh_ratio"] = ref > 0 ? fresh_gbps / ref : 0;
    }
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
  return 0;
}

std::vector<std::string> CommonArgs(const BenchArgs& a) {
  std::vector<std::string> args = {"--transport",  a.transport,
                                   "--op",         a.op,
                                   "--block-size", std::to_string(a.block_size),
                                   "--batch-size", std::to_string(a.batch_size),
                                   "--threads",    std::to_string(a.threads),
                                   "--duration",   std::to_string(a.duration),
                                   "--host",       a.host};
  if (a.gpu_src >= 0) args.insert(args.end(), {"--gpu-src", std::to_string(a.gpu_src)});
  if (a.gpu_dst >= 0) args.insert(args.end(), {"--gpu-dst", std::to_string(a.gpu_dst)});
  if (a.ref_spread) args.push_back("--ref-spread");
  if (a.ref_staged_variants) args.push_back("--ref-staged-variants");
  if (a.fresh > 0) args.insert(args.end(), {"--fresh", std::to_string(a.fresh)});
  args.insert(args.end(), {"--memory", a.memory});
  return args;
}

int RunBoth(const BenchArgs& a) {
  const std::string self = SelfExe();
  std::vector<std::string> targv = {self, "bench", "transfer", "--mode", "target"};
  for (auto& s : CommonArgs(a)) targv.push_back(s);
  for (auto& kv : a.target_env) targv.insert(targv.end(), {"--target-env", kv});
  auto target = Subprocess::Spawn(targv, true);
  if (!target.ok()) {
    std::fprintf(stderr, "bench: %s\n", target.status().ToString().c_str());
    return 1;
  }
  auto line = target.value()->ReadLine(std::chrono::seconds(30));
  char seg[256] = {};
  unsigned ref_port = 0;
  if (!line.ok() || std::sscanf(line.value().c_str(), "TARGET %255s %u", seg, &ref_port) != 2) {
    std::fprintf(stderr, "bench: the target did not start\n");
    return 1;
  }
  std::vector<std::string> iargv = {self,     "bench",      "transfer",
                                    "--mode", "initiator",  "--peer",
                                    seg,      "--ref-port", std::to_string(ref_port)};
  for (auto& s : CommonArgs(a)) iargv.push_back(s);
  for (auto& kv : a.target_env) iargv.insert(iargv.end(), {"--target-env", kv});
  for (auto& kv : a.initiator_env) iargv.insert(iargv.end(), {"--initiator-env", kv});
  if (a.json) iargv.push_back("--json");
  auto init = Subprocess::Spawn(iargv, false);
  if (!init.ok()) {
    std::fprintf(stderr, "bench: %s\n", init.status().ToString().c_str());
    return 1;
  }
  auto rc = init.value()->Wait(Millis(static_cast<int64_t>(a.duration * 1000) + 600000));
  (void)target.value()->Signal(SIGTERM);
  (void)target.value()->Wait(std::chrono::seconds(10));
  return rc.ok() ? rc.value() : 1;
}

}  // namespace

int BenchTransfer(const BenchArgs& a) {
  // Before any engine (or other thread) of this process starts.
  for (const std::string& kv : a.mode == "target"      ? a.target_env
                               : a.mode == "initiator" ? a.initiator_env
                                                       : std::vector<std::string>{}) {
    const size_t eq = kv.find('=');
    setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  const uint64_t bytes = RegionBytes(a);
  if (bytes > (8ull << 30)) {
    std::fprintf(stderr, "bench: block-size x batch-size x threads must stay under 8 GiB\n");
    return 2;
  }
  if (a.mode == "target") return RunTarget(a, bytes);
  if (a.mode == "initiator") {
    if (a.peer.empty() || a.ref_port == 0) {
      std::fprintf(stderr, "bench: --mode initiator needs --peer and --ref-port\n");
      return 2;
    }
    return RunInitiator(a);
  }
  return RunBoth(a);
}

}  // namespace ferry::cli
