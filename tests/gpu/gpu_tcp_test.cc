// GPU memory over tcp, staged through pinned host memory: the listener's
// staging under bad input, the lanes and staging that staged chunks take,
// and the bench's hand-staged reference (the traced paths:
// gpu_trace_test.cc). Without a GPU each test reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "gpu/skip.h"
#include "integration/peer.h"
#include "integration/raw_client.h"
#include "transfer/tcp/staging.h"

namespace ferry {
namespace {

// Writes into GPU memory cut off mid-payload give their staging back: more
// of them than the listener has buffers, and an engine's writes to that
// memory still land whole, their bytes exact.
TEST(Gpu, WritesCutOffMidPayloadGiveTheirStagingBack) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = 1 << 20;
  auto p = test::StartPeer(kBytes, 0, 0, kBytes);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<char> junk(300 << 10, 'x');
  for (int i = 0; i < 80; ++i) {
    test::RawClient c(p.value().port());
    ASSERT_TRUE(c.connected());
    c.SendHeader(wire::Opcode::kWrite, p.value().gpu_addr, 512 << 10);
    c.Send(junk.data(), junk.size());
  }
  EngineOptions o;
  o.transport = "tcp";
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok());
  auto seg = e.value()->OpenSegment(p.value().segment);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  for (size_t n : {kBytes, size_t{300001}}) {
    std::vector<unsigned char> out(n), in(n, 0);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(i * 13 + n);
    ASSERT_TRUE(
        e.value()->Transfer({Op::kWrite, out.data(), seg.value(), p.value().gpu_addr, n}).ok());
    ASSERT_TRUE(
        e.value()->Transfer({Op::kRead, in.data(), seg.value(), p.value().gpu_addr, n}).ok());
    EXPECT_EQ(in, out) << n << " bytes";
  }
}

// One batch, submitted and waited for (30 s at most).
Status SubmitAndWait(Engine& engine, std::vector<Request> rs) {
  auto b = engine.Submit(rs, SubmitOptions{});
  if (!b.ok()) return b.status();
  return b.value()->Wait(std::chrono::seconds(30));
}

// Batches whose requests alternate between host and GPU memory at each
// end: the submit remembers the buffers it found last (Router::Memo), and
// each request must still be routed by its own memory, staged or not.
TEST(Gpu, ABatchMixingHostAndGpuMemoryRoutesEachRequestByItsOwn) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kHalf = 1 << 20, kPiece = 64 << 10;
  auto p = test::StartPeer(2 * kHalf, 0, 0, 2 * kHalf);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const uint64_t remote_host = p.value().alloc_addr, remote_gpu = p.value().gpu_addr;
  EngineOptions o;
  o.transport = "tcp";
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok());
  Engine& engine = *e.value();
  auto dev = gpu::AllocDevice(kHalf, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* d = static_cast<char*>(dev.value());
  std::vector<char> host(kHalf, 0), out(kHalf), in(kHalf);
  ASSERT_TRUE(engine.RegisterMemory(d, kHalf).ok());
  ASSERT_TRUE(engine.RegisterMemory(host.data(), kHalf).ok());
  auto seg = engine.OpenSegment(p.value().segment);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto run = [&](std::vector<Request> rs) { return SubmitAndWait(engine, std::move(rs)); };
  // Piece k: local host memory when k is even, GPU memory when odd; remote
  // host memory when k % 4 < 2, GPU memory otherwise.
  auto mixed = [&](Op op, uint64_t at) {
    std::vector<Request> rs;
    for (size_t off = 0, k = 0; off < kHalf; off += kPiece, ++k) {
      char* local = (k % 2 == 0 ? host.data() : d) + off;
      rs.push_back(
          {op, local, seg.value(), (k % 4 < 2 ? remote_host : remote_gpu) + at + off, kPiece});
    }
    return run(rs);
  };
  test::FillRandom(out.data(), kHalf, 11);
  // The first halves of the peer's buffers hold `out`; the mixed read takes
  // each piece from one of them, the mixed write puts it in a second half.
  ASSERT_TRUE(run({{Op::kWrite, out.data(), seg.value(), remote_host, kHalf},
                   {Op::kWrite, out.data(), seg.value(), remote_gpu, kHalf}})
                  .ok());
  ASSERT_TRUE(mixed(Op::kRead, 0).ok());
  ASSERT_TRUE(mixed(Op::kWrite, kHalf).ok());
  for (uint64_t remote : {remote_host, remote_gpu}) {
    ASSERT_TRUE(run({{Op::kRead, in.data(), seg.value(), remote + kHalf, kHalf}}).ok());
    for (size_t off = 0, k = 0; off < kHalf; off += kPiece, ++k) {
      if ((k % 4 < 2) != (remote == remote_host)) continue;  // that piece went to the other
      EXPECT_EQ(std::memcmp(in.data() + off, out.data() + off, kPiece), 0)
          << "piece " << k << (remote == remote_host ? " (host)" : " (GPU)");
    }
  }
  e.value().reset();
  gpu::FreeDevice(d);
}

// Loopback connections from this network namespace to `port`, established.
int ConnectionsTo(uint16_t port) {
  std::ifstream f("/proc/self/net/tcp");
  std::string line;
  std::getline(f, line);  // the header
  int n = 0;
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (state == "01" && remote.size() > 5 && remote.substr(remote.size() - 5) == want) ++n;
  }
  return n;
}

// Chunks staged here whose far end is host memory are plain bytes there and
// take all the host lanes; chunks into GPU memory at the target take the
// GPU lanes alone, which connect once such a chunk comes.
TEST(Gpu, ChunksStagedHereTakeTheHostLanes) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kChunk = 64 << 10, kBytes = 32 * kChunk;
  auto p = test::StartPeer(kBytes, 0, 0, kBytes);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EngineOptions o;
  o.transport = "tcp";
  o.io_threads = 4;  // more than one: the lanes share a queue
  o.tcp_lanes = 6;
  o.tcp_gpu_lanes = 2;
  // GPU requests are cut by their own size: by the host one, each would be
  // one chunk, on one lane.
  o.tcp_chunk_bytes = 4 * kBytes;
  o.tcp_gpu_chunk_bytes = kChunk;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Engine& engine = *e.value();
  auto dev = gpu::AllocDevice(kBytes, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE(engine.RegisterMemory(dev.value(), kBytes).ok());
  auto seg = engine.OpenSegment(p.value().segment);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  const uint16_t port = p.value().port();
  auto write = [&](uint64_t remote) {
    for (int round = 0; round < 4; ++round) {
      Status st = engine.Transfer({Op::kWrite, dev.value(), seg.value(), remote, kBytes});
      if (!st.ok()) return st;
    }
    return Status::Ok();
  };
  // A lane connects when it first takes a chunk, and a woken lane may find
  // the shared queue emptied by another: bounds, not exact counts.
  ASSERT_TRUE(write(p.value().alloc_addr).ok());
  const int host_lanes = ConnectionsTo(port);
  EXPECT_GT(host_lanes, 2) << "GPU memory here only: more than the 2 GPU lanes";
  EXPECT_LE(host_lanes, 6);
  ASSERT_TRUE(write(p.value().gpu_addr).ok());
  const int all = ConnectionsTo(port);
  EXPECT_GT(all, host_lanes) << "GPU memory there: GPU lanes of their own";
  EXPECT_LE(all, host_lanes + 2);
  e.value().reset();
  gpu::FreeDevice(dev.value());
}

// Every peer's staged chunks share one pool of pinned staging: a second
// peer pins no more (a pool each pinned 128 MiB a peer by default), and
// reads into GPU memory from both peers at once, through a pool of fewer
// buffers than either read has chunks, land whole.
TEST(Gpu, PeersShareOnePoolOfPinnedStaging) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = 1 << 20;
  auto p1 = test::StartPeer(kBytes, 0);
  auto p2 = test::StartPeer(kBytes, 0);
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  auto dev = gpu::AllocDevice(2 * kBytes, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* d = static_cast<char*>(dev.value());
  for (int buffers : {0, 3}) {
    SCOPED_TRACE("tcp_staging_buffers " + std::to_string(buffers));
    EngineOptions o;
    o.transport = "tcp";
    o.tcp_gpu_chunk_bytes = 64 << 10;  // 16 chunks a read
    o.tcp_staging_buffers = buffers;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    Engine& engine = *e.value();
    ASSERT_TRUE(engine.RegisterMemory(d, 2 * kBytes).ok());
    const size_t before = StagingPool::BytesHeld();
    std::vector<SegmentId> segs;
    std::vector<std::vector<char>> outs;
    size_t held = 0;
    for (auto* p : {&p1.value(), &p2.value()}) {
      auto seg = engine.OpenSegment(p->segment);
      ASSERT_TRUE(seg.ok()) << seg.status().ToString();
      segs.push_back(seg.value());
      outs.emplace_back(kBytes);
      test::FillRandom(outs.back().data(), kBytes, 70 + segs.size() + buffers);
      ASSERT_TRUE(SubmitAndWait(engine, {{Op::kWrite, outs.back().data(), seg.value(),
                                          p->alloc_addr, kBytes}})
                      .ok());
      // Through staging: the engine's pool is made with its first peer.
      ASSERT_TRUE(SubmitAndWait(engine, {{Op::kRead, d, seg.value(), p->alloc_addr, kBytes}}).ok());
      if (held == 0) held = StagingPool::BytesHeld() - before;
      EXPECT_GT(held, 0u);
      EXPECT_EQ(StagingPool::BytesHeld() - before, held) << "peers opened: " << segs.size();
    }
    ASSERT_EQ(cudaMemset(d, 0, 2 * kBytes), cudaSuccess);
    ASSERT_TRUE(
        SubmitAndWait(engine, {{Op::kRead, d, segs[0], p1.value().alloc_addr, kBytes},
                               {Op::kRead, d + kBytes, segs[1], p2.value().alloc_addr, kBytes}})
            .ok());
    std::vector<char> in(kBytes);
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_EQ(cudaMemcpy(in.data(), d + i * kBytes, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(in, outs[i]) << "from peer " << i + 1;
    }
  }
  gpu::FreeDevice(d);
}

// More chunks into GPU memory at the target than may hold staging at once
// (the GPU lanes' windows), in a batch beside chunks into host memory there,
// which may take any buffer: those over the cap wait their turn, and every
// byte lands where it was sent; and reads into GPU memory here, capped too.
// The same with fewer buffers than the caps.
TEST(Gpu, ChunksOverTheGpuCapWaitTheirTurnAndLandWhole) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kPart = 256 << 10;
  auto p = test::StartPeer(kPart, 0, 0, 2 * kPart);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const uint64_t remote_host = p.value().alloc_addr, remote_gpu = p.value().gpu_addr;
  auto dev = gpu::AllocDevice(kPart, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* d = static_cast<char*>(dev.value());
  for (int buffers : {0, 3}) {
    SCOPED_TRACE("tcp_staging_buffers " + std::to_string(buffers));
    EngineOptions o;
    o.transport = "tcp";
    o.io_threads = 2;
    o.tcp_lanes = 2;
    o.tcp_gpu_lanes = 1;
    o.tcp_gpu_chunk_bytes = 4096;  // 64 chunks a request; 32 buffers, 8 for GPU memory there
    o.tcp_staging_buffers = buffers;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    Engine& engine = *e.value();
    ASSERT_TRUE(engine.RegisterMemory(d, kPart).ok());
    auto seg = engine.OpenSegment(p.value().segment);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    auto run = [&](std::vector<Request> rs) { return SubmitAndWait(engine, std::move(rs)); };
    std::vector<char> out(kPart), in(kPart);
    test::FillRandom(out.data(), kPart, 5 + buffers);
    ASSERT_TRUE(run({{Op::kWrite, out.data(), seg.value(), remote_gpu, kPart}}).ok());
    ASSERT_TRUE(run({{Op::kRead, d, seg.value(), remote_gpu, kPart}}).ok());
    ASSERT_TRUE(run({{Op::kWrite, d, seg.value(), remote_host, kPart},
                     {Op::kWrite, d, seg.value(), remote_gpu + kPart, kPart}})
                    .ok());
    for (uint64_t remote : {remote_host, remote_gpu + kPart}) {
      std::fill(in.begin(), in.end(), 0);
      ASSERT_TRUE(run({{Op::kRead, in.data(), seg.value(), remote, kPart}}).ok());
      EXPECT_EQ(in, out) << (remote == remote_host ? "host memory there" : "GPU memory there");
    }
    // Reads into GPU memory here only have a cap of their own (16 here).
    test::FillRandom(out.data(), kPart, 50 + buffers);
    ASSERT_TRUE(run({{Op::kWrite, out.data(), seg.value(), remote_host, kPart}}).ok());
    ASSERT_TRUE(run({{Op::kRead, d, seg.value(), remote_host, kPart}}).ok());
    ASSERT_TRUE(run({{Op::kWrite, d, seg.value(), remote_gpu + kPart, kPart}}).ok());
    std::fill(in.begin(), in.end(), 0);
    ASSERT_TRUE(run({{Op::kRead, in.data(), seg.value(), remote_gpu + kPart, kPart}}).ok());
    EXPECT_EQ(in, out) << "read into GPU memory here";
  }
  gpu::FreeDevice(d);
}

// A peer whose GPU chunks are smaller than ours: our larger chunks into its
// GPU memory land whole through its smaller staging, one piece after
// another; checksummed, they are refused, as their pieces would land before
// the sum was checked, and its memory keeps what it held.
TEST(Gpu, ChunksLargerThanThePeersStagingLandWholeOrAreRefusedWhole) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = 4 << 20;
  setenv("FERRY_TCP_GPU_CHUNK_BYTES", "262144", 1);
  auto p = test::StartPeer(kBytes, 0, 0, kBytes);
  unsetenv("FERRY_TCP_GPU_CHUNK_BYTES");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<char> out(kBytes), in(kBytes), other(kBytes);
  test::FillRandom(out.data(), kBytes, 77);
  test::FillRandom(other.data(), kBytes, 78);
  for (bool checksum : {false, true}) {
    SCOPED_TRACE(checksum ? "checksummed" : "plain");
    EngineOptions o;
    o.transport = "tcp";
    o.tcp_checksum = checksum;
    ASSERT_EQ(o.tcp_gpu_chunk_bytes, 1u << 20) << "the default, larger than the peer's";
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    auto seg = e.value()->OpenSegment(p.value().segment);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    const uint64_t there = p.value().gpu_addr;
    Status st = e.value()->Transfer(
        {Op::kWrite, (checksum ? other : out).data(), seg.value(), there, kBytes});
    if (checksum) {
      EXPECT_EQ(st.code(), StatusCode::kNotSupported) << st.ToString();
    } else {
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    std::fill(in.begin(), in.end(), 0);
    ASSERT_TRUE(e.value()->Transfer({Op::kRead, in.data(), seg.value(), there, kBytes}).ok());
    EXPECT_EQ(in, out);
  }
}

// The knobs that change who sees a copy into the GPU done, each set for
// the peer (a new process) and this engine: FERRY_COPY_FLAGS=1, completions
// seen through words the copier's streams write; FERRY_LANDING_THREADS, a
// pool that lands at the target instead of the socket threads, alone and
// with FERRY_LANDING_LOOK_US, the landing thread looking for its own copy's
// end (read once a process, so here only if no earlier test has landed a
// chunk); FERRY_READ_PIECE_KIB,
// reads into GPU memory landing 64 KiB at a time as they come in (read by
// each engine); FERRY_WRITEBACK_EAGER and FERRY_WRITEBACK_TAIL_KIB, the
// staging written back as it comes in or only its tail (read once a
// process, as the look); FERRY_LAND_DEFER, landings not held on the
// socket thread (0), or held for 4 later ones rather than the default 1,
// the rest landed early once the lane or connection waits (read by each
// engine, here and at the peer); FERRY_LAND_EARLY_WRITEBACK=0, those
// landed early without the write-back. GPU chunks go both ways and land whole.
// A missed flag or look only delays a copy to the copier's thread, which
// the bench measures, not this test.
class GpuCompletionKnob : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuCompletionKnob, CopiesLandWhole) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = 4 << 20;
  // One or more NAME=VALUE, space-separated.
  std::vector<std::string> names;
  std::istringstream knobs(GetParam());
  for (std::string knob; knobs >> knob;) {
    names.push_back(knob.substr(0, knob.find('=')));
    setenv(names.back().c_str(), knob.substr(knob.find('=') + 1).c_str(), 1);
  }
  auto p = test::StartPeer(kBytes, 0, 0, kBytes);
  EngineOptions o;
  o.transport = "tcp";
  o.tcp_gpu_chunk_bytes = 256 << 10;  // four pieces a chunk
  auto e = Engine::Create(o);
  for (const auto& name : names) unsetenv(name.c_str());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto dev = gpu::AllocDevice(kBytes, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE(e.value()->RegisterMemory(dev.value(), kBytes).ok());
  auto seg = e.value()->OpenSegment(p.value().segment);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  std::vector<char> out(kBytes), in(kBytes);
  for (int round = 0; round < 3; ++round) {
    test::FillRandom(out.data(), kBytes, 900 + round);
    const uint64_t there = p.value().gpu_addr, host_there = p.value().alloc_addr;
    ASSERT_TRUE(e.value()->Transfer({Op::kWrite, out.data(), seg.value(), there, kBytes}).ok());
    ASSERT_TRUE(e.value()->Transfer({Op::kRead, dev.value(), seg.value(), there, kBytes}).ok());
    ASSERT_TRUE(
        e.value()->Transfer({Op::kWrite, dev.value(), seg.value(), host_there, kBytes}).ok());
    std::fill(in.begin(), in.end(), 0);
    ASSERT_TRUE(e.value()->Transfer({Op::kRead, in.data(), seg.value(), host_there, kBytes}).ok());
    EXPECT_EQ(in, out) << "round " << round;
  }
  e.value().reset();
  gpu::FreeDevice(dev.value());
}

INSTANTIATE_TEST_SUITE_P(Knobs, GpuCompletionKnob,
                         ::testing::Values("FERRY_COPY_FLAGS=1", "FERRY_LANDING_THREADS=-1",
                                           "FERRY_LANDING_THREADS=2 FERRY_LANDING_LOOK_US=1000",
                                           "FERRY_LANDING_THREADS=2 FERRY_READ_LANDING=0",
                                           "FERRY_READ_PIECE_KIB=64", "FERRY_WRITEBACK_EAGER=1",
                                           "FERRY_WRITEBACK_TAIL_KIB=64", "FERRY_LAND_DEFER=0",
                                           "FERRY_LAND_DEFER=4", "FERRY_LAND_EARLY_WRITEBACK=0"));

// Copier::Run: pieces added one by one all land before End reports;
// a run on a GPU that is not there fails its Add and its End.
TEST(Gpu, CopierRunLandsEveryPieceBeforeItsEnd) {
  SKIP_WITHOUT_GPU();
  auto copier = gpu::Copier::Create();
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  constexpr size_t kBytes = 4 << 20, kPiece = 256 << 10;
  auto src = gpu::AllocPinned(kBytes);
  auto back = gpu::AllocPinned(kBytes);
  auto dev = gpu::AllocDevice(kBytes, 0);
  ASSERT_TRUE(src.ok() && back.ok() && dev.ok());
  char* s = static_cast<char*>(src.value());
  test::FillRandom(s, kBytes, 77);
  auto run = copier.value()->StartRun(0, nullptr);
  for (size_t at = 0; at < kBytes; at += kPiece) {
    ASSERT_TRUE(run->Add(static_cast<char*>(dev.value()) + at, s + at, kPiece).ok());
  }
  std::promise<Status> ended;
  run->End([&](const Status& st) { ended.set_value(st); });
  auto f = ended.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(f.get().ok());
  std::promise<Status> back_done;
  copier.value()->CopyAsync(back.value(), dev.value(), kBytes, 0, nullptr,
                            [&](const Status& st) { back_done.set_value(st); });
  ASSERT_TRUE(back_done.get_future().get().ok());
  EXPECT_EQ(std::memcmp(back.value(), s, kBytes), 0);

  auto bad = copier.value()->StartRun(gpu::DeviceCount(), nullptr);
  EXPECT_EQ(bad->Add(dev.value(), s, kPiece).code(), StatusCode::kInvalidArgument);
  Status end_status;
  bad->End([&](const Status& st) { end_status = st; });
  EXPECT_EQ(end_status.code(), StatusCode::kInvalidArgument);
  gpu::FreePinned(src.value());
  gpu::FreePinned(back.value());
  gpu::FreeDevice(dev.value());
}

// Copier::CopyAndLook: `done` runs once, with the bytes in place, whether
// the copy ends within the look (on this thread) or after it (on the
// copier's thread): 4 KiB, and 64 MiB, which outlasts a 100 us look.
TEST(Gpu, CopyAndLookRunsDoneOnceWithTheBytesInPlace) {
  SKIP_WITHOUT_GPU();
  auto copier = gpu::Copier::Create();
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  constexpr size_t kMax = 64 << 20;
  auto src = gpu::AllocPinned(kMax);
  auto back = gpu::AllocPinned(kMax);
  auto dev = gpu::AllocDevice(kMax, 0);
  ASSERT_TRUE(src.ok() && back.ok() && dev.ok());
  // Waits for a done that counts its calls; then a moment for a second one.
  auto wait = [](std::atomic<int>& calls) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (calls.load() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  for (size_t n : {size_t{4096}, kMax}) {
    for (int look_us : {0, 100, 10000}) {
      SCOPED_TRACE(std::to_string(n) + " bytes, look " + std::to_string(look_us) + " us");
      test::FillRandom(src.value(), n, n + static_cast<size_t>(look_us));
      std::atomic<int> calls{0};
      std::atomic<bool> ok{false}, here{false};
      const auto caller = std::this_thread::get_id();
      copier.value()->CopyAndLook(dev.value(), src.value(), n, 0, nullptr, look_us,
                                  [&](const Status& st) {
                                    ok = st.ok();
                                    here = std::this_thread::get_id() == caller;
                                    ++calls;
                                  });
      wait(calls);
      ASSERT_EQ(calls.load(), 1);
      EXPECT_TRUE(ok.load());
      if (look_us == 0) {
        EXPECT_FALSE(here.load()) << "no look: the copier's thread runs done";
      }
      std::atomic<int> back_calls{0};
      std::memset(back.value(), 0, n);
      copier.value()->CopyAsync(back.value(), dev.value(), n, 0, nullptr,
                                [&](const Status&) { ++back_calls; });
      wait(back_calls);
      ASSERT_EQ(back_calls.load(), 1);
      EXPECT_EQ(std::memcmp(back.value(), src.value(), n), 0);
    }
  }
  gpu::FreePinned(src.value());
  gpu::FreePinned(back.value());
  gpu::FreeDevice(dev.value());
}

// The bench's hand-staged reference: blocks stored through one buffer come
// back through the other, each where it was put; a block stored in two
// pieces lands whole.
TEST(Gpu, StagedPipeMovesBlocksThroughBothBuffers) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBlock = 64 << 10;
  auto pipe = gpu::StagedPipe::Create(0, kBlock);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  auto dev = gpu::AllocDevice(2 * kBlock, 0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  char* d = static_cast<char*>(dev.value());
  gpu::StagedPipe& p = *pipe.value();
  std::vector<char> a(kBlock), b(kBlock);
  test::FillRandom(a.data(), kBlock, 1);
  test::FillRandom(b.data(), kBlock, 2);
  std::copy(a.begin(), a.end(), p.buffer(0));
  std::copy(b.begin(), b.end(), p.buffer(1));
  ASSERT_TRUE(p.Store(0, 0, d, kBlock / 2).ok());
  ASSERT_TRUE(p.Store(0, kBlock / 2, d + kBlock / 2, kBlock / 2).ok());
  ASSERT_TRUE(p.Store(1, 0, d + kBlock, kBlock).ok());
  ASSERT_TRUE(p.Wait(0).ok());
  ASSERT_TRUE(p.Wait(1).ok());
  std::fill(p.buffer(0), p.buffer(0) + kBlock, 0);
  std::fill(p.buffer(1), p.buffer(1) + kBlock, 0);
  ASSERT_TRUE(p.Fetch(1, d, kBlock).ok());
  ASSERT_TRUE(p.Fetch(0, d + kBlock, kBlock).ok());
  ASSERT_TRUE(p.Wait(1).ok());
  ASSERT_TRUE(p.Wait(0).ok());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), p.buffer(1)));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), p.buffer(0)));
  gpu::FreeDevice(d);
}

// GPU memory over tcp is set against the same raw streams staging it by
// hand, beside the host streams, both ways; and, asked for, the same
// streams staging with the receiver's write-back, whole and in pieces.
TEST(Gpu, BenchSetsGpuTcpAgainstStreamsThatStageByHand) {
  SKIP_WITHOUT_GPU();
  for (const char* op : {"write", "read"}) {
    SCOPED_TRACE(op);
    auto j = test::RunBench({"--transport", "tcp", "--op", op, "--block-size", "1MiB",
                             "--batch-size", "4", "--duration", "0.3", "--gpu-src", "0",
                             "--gpu-dst", "0", "--ref-staged-variants"});
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    EXPECT_EQ(j.value()["transport"], "tcp");
    EXPECT_GT(j.value()["reference_gbps"].get<double>(), 0) << "the host streams failed";
    ASSERT_TRUE(j.value().contains("reference_staged_gbps")) << "the staged streams failed";
    EXPECT_GT(j.value()["ratio_staged"].get<double>(), 0);
    ASSERT_TRUE(j.value().contains("reference_link_gbps")) << "the link's copies failed";
    EXPECT_GT(j.value()["ratio_link"].get<double>(), 0);
    ASSERT_TRUE(j.value().contains("link_pool_beside_streams_gbps")) << "the shared link failed";
    EXPECT_GT(j.value()["link_pool_alone_gbps"].get<double>(), 0);
    EXPECT_GT(j.value()["streams_beside_link_gbps"].get<double>(), 0);
    ASSERT_TRUE(j.value().contains("copy_in_written_gbps")) << "GPU memory at the destination";
    EXPECT_GT(j.value()["copy_in_written_back_gbps"].get<double>(), 0);
    ASSERT_EQ(j.value()["reference_staged_variants"].size(), 4u);
    for (const auto& v : j.value()["reference_staged_variants"]) {
      EXPECT_GT(v["gbps"].get<double>(), 0) << "staged streams failed: " << v.dump();
    }
  }
}

// The link's ceiling makes both trips at once, or the one asked for, and
// refuses to measure nothing.
TEST(Gpu, StagingBandwidthMeasuresTheTripsAskedFor) {
  EXPECT_EQ(gpu::StagingBandwidth(-1, -1, 1 << 20, 0.1).status().code(),
            StatusCode::kInvalidArgument);
  SKIP_WITHOUT_GPU();
  for (auto [out, in] : {std::pair{0, 0}, std::pair{0, -1}, std::pair{-1, 0}}) {
    auto r = gpu::StagingBandwidth(out, in, 1 << 20, 0.05);
    ASSERT_TRUE(r.ok()) << out << " " << in << ": " << r.status().ToString();
    EXPECT_GT(r.value(), 0);
  }
}

// Copies in from just-written blocks are timed, with the write-back and
// without, and a device that is not there is an error, not a rate.
TEST(Gpu, CopyInFromWrittenBandwidthTimesBothWays) {
  SKIP_WITHOUT_GPU();
  for (bool write_back : {true, false}) {
    auto r = gpu::CopyInFromWrittenBandwidth(0, 1 << 20, 0.05, write_back);
    ASSERT_TRUE(r.ok()) << write_back << ": " << r.status().ToString();
    EXPECT_GT(r.value(), 0);
  }
  EXPECT_EQ(
      gpu::CopyInFromWrittenBandwidth(gpu::DeviceCount(), 1 << 20, 0.05, true).status().code(),
      StatusCode::kInvalidArgument);
}

// With `more`, the copies go on exactly while it says so, whatever
// `seconds`, over a host span of several blocks.
TEST(Gpu, StagingBandwidthCopiesWhileAskedTo) {
  SKIP_WITHOUT_GPU();
  int asked = 0;
  auto r = gpu::StagingBandwidth(0, -1, 1 << 20, 100.0, 4 << 20, [&asked] { return ++asked < 5; });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r.value(), 0);
  EXPECT_EQ(asked, 5);
}

}  // namespace
}  // namespace ferry
