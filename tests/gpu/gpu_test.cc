// GPU tests. On a machine without a GPU (CI) every test reports itself as
// skipped with the reason; the no-GPU checks run everywhere.
#include "gpu/gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_claim.h"
#include "ferry/engine.h"
#include "gpu/kernels.h"
#include "gpu/skip.h"
#include "integration/peer.h"

#ifdef FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry {
namespace {

TEST(Gpu, ProbeNeverFailsAndHostMemoryIsPageable) {
  // With no driver this must say "no GPU", not crash or exit.
  EXPECT_FALSE(gpu::Describe().empty());
  std::vector<char> host(4096);
  EXPECT_EQ(gpu::Classify(host.data()).kind, gpu::MemoryKind::kHostPageable);
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e.value()->RegisterMemory(host.data(), host.size()).ok());
}

#ifdef FERRY_HAVE_CUDA
TEST(Gpu, ClassifiesDevicePinnedAndPageableMemory) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 3 << 20), cudaSuccess);
  gpu::MemoryInfo d = gpu::Classify(static_cast<char*>(dev) + 4096);
  EXPECT_EQ(d.kind, gpu::MemoryKind::kDevice);
  EXPECT_EQ(d.device, 0);
  EXPECT_EQ(d.alloc_base, reinterpret_cast<uint64_t>(dev));
  EXPECT_GE(d.alloc_size, 3u << 20);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  EXPECT_EQ(gpu::Classify(pinned).kind, gpu::MemoryKind::kHostPinned);
  std::vector<char> pageable(4096);
  EXPECT_EQ(gpu::Classify(pageable.data()).kind, gpu::MemoryKind::kHostPageable);
  cudaFreeHost(pinned);
  cudaFree(dev);
}

TEST(Gpu, EngineLeavesTheCallersCurrentDeviceAlone) {
  // Regression: the engine's teardown left the last GPU current on the
  // caller's thread. Only two GPUs can tell the devices apart.
  if (gpu::DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs; " << gpu::Describe();
  // The old teardown walked every GPU and stayed on the last one.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  {
    auto e = Engine::Create({});
    ASSERT_TRUE(e.ok());
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, 1 << 20), cudaSuccess);
    auto mem = e.value()->AllocateMemory(1 << 20);
    ASSERT_TRUE(mem.ok());
    auto seg = e.value()->OpenSegment(e.value()->name());
    ASSERT_TRUE(seg.ok());
    auto b =
        e.value()->Submit(std::vector<Request>{{Op::kWrite, dev, seg.value(),
                                                reinterpret_cast<uint64_t>(mem.value()), 1 << 20}},
                          SubmitOptions{});
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b.value()->Wait(std::chrono::seconds(10)).ok());
    b.value().reset();
    cudaFree(dev);
  }
  int now = -1;
  cudaGetDevice(&now);
  EXPECT_EQ(now, 0);
}

// A device buffer as the producer; the target is the engine's own segment
// (local) or a `ferry serve` peer process on the same host (cuda_ipc, or tcp
// when forced), each exposing a GPU buffer and a page-locked memfd host buffer.
class GpuTransfer : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr size_t kBytes = 1 << 20;

  void SetUp() override {
    if (gpu::DeviceCount() == 0) GTEST_SKIP() << gpu::Describe();
    EngineOptions opts;
    if (GetParam() == "tcp") opts.transport = "tcp";
    auto e = Engine::Create(opts);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    ASSERT_EQ(cudaMalloc(&src_, kBytes), cudaSuccess);
    if (GetParam() == "local") {
      ASSERT_EQ(cudaMalloc(&own_dev_, kBytes), cudaSuccess);
      ASSERT_TRUE(engine_->RegisterMemory(own_dev_, kBytes).ok());
      auto host = engine_->AllocateMemory(kBytes);  // memfd, page-locked
      ASSERT_TRUE(host.ok());
      dev_dst_ = reinterpret_cast<uint64_t>(own_dev_);
      host_dst_ = reinterpret_cast<uint64_t>(host.value());
      name_ = engine_->name();
      want_ = "local";
    } else {
      auto p = test::StartPeer(kBytes, 0, 0, kBytes);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      peer_ = std::move(p).value();
      dev_dst_ = peer_.gpu_addr;
      host_dst_ = peer_.alloc_addr;
      name_ = peer_.segment;
      want_ = GetParam();
    }
    auto seg = engine_->OpenSegment(name_);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    seg_ = seg.value();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming), cudaSuccess);
    // Warm up the producer kernel and the engine's GPU path: first-use costs
    // must not outlast a producer that the tests require to be running.
    test::LaunchSpinThenFill(src_, kBytes, 0, 1000, stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    SubmitOptions warm;
    warm.stream = stream_;
    auto b = engine_->Submit(std::vector<Request>{{Op::kWrite, src_, seg_, host_dst_, 4096}}, warm);
    ASSERT_TRUE(b.ok() && b.value()->Wait(std::chrono::seconds(10)).ok());
  }

  void TearDown() override {
    if (gpu::DeviceCount() == 0) return;
    cudaDeviceSynchronize();
    cudaEventDestroy(produced_);
    cudaStreamDestroy(stream_);
    cudaStreamDestroy(side_);
    cudaFree(src_);
    if (own_dev_ != nullptr) cudaFree(own_dev_);
    engine_.reset();
  }

  // The watchdog: polls instead of blocking, so a hang fails the test.
  static bool SyncWithin(cudaStream_t s, std::chrono::seconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      cudaError_t e = cudaStreamQuery(s);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;
  }

  // Reads `n` bytes at `remote` back through the engine and checks them.
  bool Holds(uint64_t remote, size_t n, unsigned char v) {
    std::vector<unsigned char> back(n, static_cast<unsigned char>(v + 1));
    SubmitOptions o;
    o.already_ready = true;
    auto b = engine_->Submit(std::vector<Request>{{Op::kRead, back.data(), seg_, remote, n}}, o);
    if (!b.ok() || !b.value()->Wait(std::chrono::seconds(10)).ok()) return false;
    for (unsigned char c : back) {
      if (c != v) return false;
    }
    return true;
  }

  // One round: a producer still running at submit fills src_ with `v`; the
  // engine writes src_ to `dst` in `pieces` requests. Returns whether `dst`
  // then holds `v`, and sets `pending` if the producer was unfinished at the call.
  bool Round(unsigned char v, int pieces, bool side_stream, bool already_ready, uint64_t dst,
             bool* pending) {
    cudaStream_t producer = side_stream ? side_ : stream_;
    test::LaunchSpinThenFill(src_, kBytes, v, 10'000'000,
                             producer);  // about 10 ms: still running at the check
    cudaEventRecord(produced_, producer);
    if (side_stream) cudaStreamWaitEvent(stream_, produced_, 0);  // the caller joins it
    std::vector<Request> reqs;
    const size_t piece = kBytes / static_cast<size_t>(pieces);
    for (int i = 0; i < pieces; ++i) {
      reqs.push_back(
          {Op::kWrite, static_cast<char*>(src_) + i * piece, seg_, dst + i * piece, piece});
    }
    SubmitOptions o;
    o.stream = stream_;
    o.already_ready = already_ready;
    auto b = engine_->Submit(reqs, o);
    *pending = cudaEventQuery(produced_) == cudaErrorNotReady;
    if (!b.ok() || !b.value()->Wait(std::chrono::seconds(10)).ok()) return false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(b.value()->Result(i).transport, want_);
    }
    return Holds(dst, kBytes, v);
  }

  // 100 rounds; returns how many were correct, and checks the producer was
  // pending at every submit.
  int Rounds(int pieces, bool side_stream, bool already_ready, uint64_t dst) {
    int correct = 0, pending_rounds = 0;
    for (int r = 0; r < 100; ++r) {
      bool pending = false;
      if (Round(static_cast<unsigned char>(r + 1), pieces, side_stream, already_ready, dst,
                &pending)) {
        ++correct;
      }
      pending_rounds += pending ? 1 : 0;
      cudaStreamSynchronize(stream_);
      cudaStreamSynchronize(side_);
    }
    EXPECT_EQ(pending_rounds, 100) << "the producer must still run when submit returns";
    return correct;
  }

  std::unique_ptr<Engine> engine_;
  test::Peer peer_;
  std::string name_;
  SegmentId seg_ = 0;
  std::string want_;
  void* src_ = nullptr;
  void* own_dev_ = nullptr;
  uint64_t dev_dst_ = 0, host_dst_ = 0;
  cudaStream_t stream_ = nullptr, side_ = nullptr;
  cudaEvent_t produced_ = nullptr;
};

TEST_P(GpuTransfer, ReadinessDeviceToHostSingleAndBatched) {
  EXPECT_EQ(Rounds(1, false, false, host_dst_), 100);
  EXPECT_EQ(Rounds(8, false, false, host_dst_), 100);
}

TEST_P(GpuTransfer, ReadinessDeviceToDeviceSingleAndBatched) {
  EXPECT_EQ(Rounds(1, false, false, dev_dst_), 100);
  EXPECT_EQ(Rounds(8, false, false, dev_dst_), 100);
}

TEST_P(GpuTransfer, ReadinessWithAProducerOnASideStreamJoinedByAnEvent) {
  EXPECT_EQ(Rounds(1, true, false, host_dst_), 100);
  EXPECT_EQ(Rounds(8, true, false, dev_dst_), 100);
}

TEST_P(GpuTransfer, ControlWithoutReadinessReadsStaleData) {
  // Proves the readiness test can fail: opting out copies before the producer.
  int correct = Rounds(1, false, true, dev_dst_);
  RecordProperty("control_correct_of_100", correct);
  EXPECT_LT(correct, 100);
}

// A transfer on an idle stream completes while a one-second kernel still runs
// on a blocking stream: had it waited behind the kernel (the legacy default
// stream's implicit sync), the kernel would be done by then. A causal check,
// not a timing; the time taken is recorded, for the benchmarks' record only.
TEST_P(GpuTransfer, NoStallBehindAKernelOnABlockingStream) {
  cudaStream_t blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, 4096), cudaSuccess);
  cudaMemset(src_, 7, 4096);
  cudaDeviceSynchronize();
  test::LaunchSpinThenFill(scratch, 4096, 1, 1'000'000'000, blocking);  // about 1 s
  for (uint64_t dst : {dev_dst_, host_dst_}) {
    auto t0 = std::chrono::steady_clock::now();
    SubmitOptions o;
    o.stream = stream_;  // idle; any stream but the legacy default
    auto b = engine_->Submit(std::vector<Request>{{Op::kWrite, src_, seg_, dst, 4096}}, o);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(b.value()->Wait(std::chrono::seconds(10)).ok());
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(cudaStreamQuery(blocking), cudaErrorNotReady) << "the kernel must still run";
    EXPECT_EQ(b.value()->Result(0).transport, want_);
    RecordProperty(dst == dev_dst_ ? "no_stall_d2d_ms" : "no_stall_d2h_ms", std::to_string(ms));
  }
  cudaStreamSynchronize(blocking);
  EXPECT_TRUE(Holds(dev_dst_, 4096, 7));
  EXPECT_TRUE(Holds(host_dst_, 4096, 7));
  cudaStreamDestroy(blocking);
  cudaFree(scratch);
}

TEST_P(GpuTransfer, StreamOrderedOnEveryKindOfStream) {
  cudaStream_t blocking, nonblocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  unsigned char* check = nullptr;
  void* back = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&check), kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&back, kBytes), cudaSuccess);
  struct Kind {
    const char* name;
    cudaStream_t stream;
  };
  const Kind kinds[] = {{"legacy (null)", nullptr},
                        {"legacy", cudaStreamLegacy},
                        {"per-thread", cudaStreamPerThread},
                        {"blocking", blocking},
                        {"non-blocking", nonblocking}};
  unsigned char* counter = nullptr;  // bumped by each never-launched kernel
  ASSERT_EQ(cudaMallocManaged(reinterpret_cast<void**>(&counter), 1), cudaSuccess);
  *counter = 0;
  int fresh = 0;
  unsigned char v = 0;
  for (const Kind& k : kinds) {
    for (uint64_t dst : {dev_dst_, host_dst_}) {
      int correct = 0;
      for (int r = 0; r < 10; ++r) {
        ++v;
        // producer -> transfer out -> transfer back -> consumer, all on one stream
        test::LaunchSpinThenFill(src_, kBytes, v, 1'000'000, k.stream);
        auto w = engine_->SubmitOnStream(
            std::vector<Request>{{Op::kWrite, src_, seg_, dst, kBytes}}, k.stream);
        ASSERT_TRUE(w.ok()) << k.name << ": " << w.status().ToString();
        // A kernel never launched before, right after the submit: under lazy
        // loading its first launch loads a module while the transfer is queued.
        if (r == 0 && fresh < test::kFreshKernels) test::LaunchFresh(fresh++, counter, k.stream);
        auto rd = engine_->SubmitOnStream(
            std::vector<Request>{{Op::kRead, back, seg_, dst, kBytes}}, k.stream);
        ASSERT_TRUE(rd.ok()) << k.name << ": " << rd.status().ToString();
        ASSERT_EQ(cudaMemcpyAsync(check, back, kBytes, cudaMemcpyDeviceToHost, k.stream),
                  cudaSuccess);
        ASSERT_TRUE(SyncWithin(k.stream, std::chrono::seconds(30)))
            << k.name << ": the stream hung (watchdog)";
        ASSERT_TRUE(w.value()->Wait(std::chrono::seconds(10)).ok()) << k.name;
        ASSERT_TRUE(rd.value()->Wait(std::chrono::seconds(10)).ok()) << k.name;
        EXPECT_EQ(w.value()->Result(0).transport, want_);
        bool ok = true;
        for (size_t i = 0; i < kBytes && ok; ++i) ok = check[i] == v;
        correct += ok ? 1 : 0;
      }
      EXPECT_EQ(correct, 10) << k.name << (dst == dev_dst_ ? " to GPU" : " to host");
    }
  }
  EXPECT_EQ(*counter, fresh) << "every fresh kernel ran once";
  cudaFree(counter);
  // Under graph capture: a clear error, and nothing is added to the graph.
  ASSERT_EQ(cudaStreamBeginCapture(nonblocking, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  auto g = engine_->SubmitOnStream(std::vector<Request>{{Op::kWrite, src_, seg_, dev_dst_, kBytes}},
                                   nonblocking);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(nonblocking, &graph), cudaSuccess);
  EXPECT_EQ(g.status().code(), StatusCode::kNotSupported) << g.status().ToString();
  size_t nodes = 99;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  EXPECT_EQ(nodes, 0u);
  cudaGraphDestroy(graph);
  // Host memory on both sides: the transfer starts after the stream's earlier
  // work, here a kernel that fills the page-locked source.
  int host_correct = 0;
  for (int r = 0; r < 10; ++r) {
    ++v;
    test::LaunchSpinThenFill(check, 4096, v, 1'000'000, nonblocking);
    auto h = engine_->SubmitOnStream(
        std::vector<Request>{{Op::kWrite, check, seg_, host_dst_, 4096}}, nonblocking);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(SyncWithin(nonblocking, std::chrono::seconds(30))) << "host: the stream hung";
    ASSERT_TRUE(h.value()->Wait(std::chrono::seconds(10)).ok());
    host_correct += Holds(host_dst_, 4096, v) ? 1 : 0;
  }
  EXPECT_EQ(host_correct, 10) << "host to host";
  cudaFreeHost(check);
  cudaFree(back);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonblocking);
}

TEST_P(GpuTransfer, ReadsLandInGpuMemoryAfterTheSubmissionStream) {
  // R2: the read must not overwrite `dst` before the stream's earlier work.
  std::vector<unsigned char> pattern(kBytes);
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  std::vector<unsigned char> check(kBytes);
  int correct = 0;
  for (int r = 0; r < 20; ++r) {
    const unsigned char v = static_cast<unsigned char>(200 + r);
    std::fill(pattern.begin(), pattern.end(), v);
    ASSERT_TRUE(engine_->Transfer({Op::kWrite, pattern.data(), seg_, host_dst_, kBytes}).ok());
    // An earlier kernel on the stream writes `dst`; the read must land after it.
    test::LaunchSpinThenFill(dst, kBytes, 1, 2'000'000, stream_);
    SubmitOptions o;
    o.stream = stream_;
    auto b = engine_->Submit(std::vector<Request>{{Op::kRead, dst, seg_, host_dst_, kBytes}}, o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE(b.value()->Wait(std::chrono::seconds(10)).ok());
    EXPECT_EQ(b.value()->Result(0).transport, want_);
    cudaStreamSynchronize(stream_);
    cudaMemcpy(check.data(), dst, kBytes, cudaMemcpyDeviceToHost);
    bool ok = true;
    for (size_t i = 0; i < kBytes && ok; ++i) ok = check[i] == v;
    correct += ok ? 1 : 0;
  }
  EXPECT_EQ(correct, 20);
  cudaFree(dst);
}

TEST_P(GpuTransfer, GpuMemoryAtATcpTargetFromHostBuffers) {
  // The target's listener stages GPU memory: writes land in device memory
  // before the ack, reads come from it. Sizes cross its staging buffers.
  if (GetParam() == "cuda_ipc") {
    GTEST_SKIP() << "the /tcp case: this test reaches the same peer over tcp either way";
  }
  EngineOptions o;
  o.transport = "tcp";
  auto other = Engine::Create(o);
  ASSERT_TRUE(other.ok());
  auto seg = other.value()->OpenSegment(name_);
  ASSERT_TRUE(seg.ok());
  for (size_t n : {size_t{1}, size_t{4097}, kBytes}) {
    std::vector<unsigned char> out(n), in(n, 0);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(i * 7 + n);
    ASSERT_TRUE(other.value()->Transfer({Op::kWrite, out.data(), seg.value(), dev_dst_, n}).ok());
    ASSERT_TRUE(other.value()->Transfer({Op::kRead, in.data(), seg.value(), dev_dst_, n}).ok());
    EXPECT_EQ(in, out) << n << " bytes";
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, GpuTransfer, ::testing::Values("local", "cuda_ipc", "tcp"),
                         [](const auto& info) { return info.param; });

// A peer's registrations change after the segment was opened: `ferry serve`
// swaps its GPU buffer on SIGUSR1 (registers a new one, unregisters the old).
// With no submit in between, the engine imports the new buffer and closes its
// import of the old one (off the data path: peers.cc, WatchRound); then cuda_ipc
// reaches the new buffer, from a stream too, and refuses the old one. Before,
// the endpoint kept the imports it was made with: the new buffer was "not
// GPU-reachable" and the old import stayed open until the segment closed.
TEST(CudaIpc, FollowsAPeersRegistrationChangesOffTheDataPath) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kLen = 1 << 20;
  auto peer = test::StartPeer(1 << 20, 0, 0, kLen);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  Engine& engine = *e.value();
  void *src = nullptr, *back = nullptr;
  ASSERT_EQ(cudaMalloc(&src, kLen), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&back, kLen), cudaSuccess);
  ASSERT_TRUE(engine.RegisterMemory(src, kLen).ok());
  ASSERT_TRUE(engine.RegisterMemory(back, kLen).ok());
  const gpu::IpcImportCounts at_start = gpu::IpcImports();
  auto seg = engine.OpenSegment(peer.value().segment);
  ASSERT_TRUE(seg.ok());
  const gpu::IpcImportCounts opened = gpu::IpcImports();
  EXPECT_EQ(opened.open, at_start.open + 1) << "the peer's GPU buffer, imported at open";
  auto move = [&](Op op, void* local, uint64_t remote) -> std::pair<Status, std::string_view> {
    auto b = engine.Submit(std::vector<Request>{{op, local, seg.value(), remote, kLen}},
                           SubmitOptions{});
    if (!b.ok()) return {b.status(), kNoTransport};
    Status st = b.value()->Wait(std::chrono::seconds(10));
    return {st, b.value()->Result(0).transport};
  };
  // SIGUSR1 makes the peer swap its GPU buffer; it prints the new one.
  auto swap = [&](uint64_t* addr) {
    ASSERT_TRUE(peer.value().proc->Signal(SIGUSR1).ok());
    auto line = peer.value().proc->ReadLine(std::chrono::seconds(20));
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    auto j = nlohmann::json::parse(line.value(), nullptr, false);
    ASSERT_TRUE(!j.is_discarded() && j.contains("gpu")) << line.value();
    *addr = j["gpu"]["addr"];
  };
  const uint64_t old_addr = peer.value().gpu_addr;
  ASSERT_EQ(cudaMemset(src, 0x11, kLen), cudaSuccess);
  auto [first, via] = move(Op::kWrite, src, old_addr);
  ASSERT_TRUE(first.ok()) << first.ToString();
  EXPECT_EQ(via, "cuda_ipc");

  uint64_t new_addr = 0;
  ASSERT_NO_FATAL_FAILURE(swap(&new_addr));
  ASSERT_NE(new_addr, old_addr);

  gpu::IpcImportCounts now = gpu::IpcImports();
  for (int i = 0; i < 400 && (now.opened != opened.opened + 1 || now.open != opened.open); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = gpu::IpcImports();
  }
  EXPECT_EQ(now.opened, opened.opened + 1) << "the new buffer, imported before any submit";
  EXPECT_EQ(now.open, opened.open) << "the old buffer's import, closed";

  const Status refused = move(Op::kWrite, src, old_addr).first;
  EXPECT_EQ(refused.code(), StatusCode::kOutOfRange) << refused.ToString();
  ASSERT_EQ(cudaMemset(src, 0x5a, kLen), cudaSuccess);
  ASSERT_EQ(cudaMemset(back, 0, kLen), cudaSuccess);
  auto [wrote, via_w] = move(Op::kWrite, src, new_addr);
  ASSERT_TRUE(wrote.ok()) << wrote.ToString();
  EXPECT_EQ(via_w, "cuda_ipc");
  // Read back on a stream: the stream-ordered path maps the new buffer too.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto b = engine.SubmitOnStream(
      std::vector<Request>{{Op::kRead, back, seg.value(), new_addr, kLen}}, s);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b.value()->Wait(std::chrono::seconds(10)).ok());
  EXPECT_EQ(b.value()->Result(0).transport, "cuda_ipc");
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<unsigned char> check(kLen);
  ASSERT_EQ(cudaMemcpy(check.data(), back, kLen, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::count(check.begin(), check.end(), 0x5a), static_cast<long>(kLen));

  // Swapped again, and written at once: the submit waits for the watch to
  // follow (peers.cc, RefreshIfChanged) rather than failing or importing.
  uint64_t third_addr = 0;
  ASSERT_NO_FATAL_FAILURE(swap(&third_addr));
  auto [at_once, via_at_once] = move(Op::kWrite, src, third_addr);
  EXPECT_TRUE(at_once.ok()) << at_once.ToString();
  EXPECT_EQ(via_at_once, "cuda_ipc");
  EXPECT_EQ(gpu::IpcImports().opened, opened.opened + 2);
  ASSERT_TRUE(engine.CloseSegment(seg.value()).ok());
  cudaStreamDestroy(s);
  cudaFree(src);
  cudaFree(back);
}

// At the defaults a tcp target lands what its sockets receive on their own
// threads: no landing pool; landing_threads makes one.
TEST(Gpu, NoLandingThreadsUnlessAsked) {
  SKIP_WITHOUT_GPU();
  auto landing = [] { return static_cast<int>(test::CpusOfThreadsNamed("ferry-landing").size()); };
  for (const int threads : {0, 2}) {
    // Counted against any an earlier test's engine may have left.
    const int before = landing();
    EngineOptions o;
    if (threads > 0) o.landing_threads = threads;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(landing() - before, threads);
  }
}

// FERRY_HELPER_CPUS=1 keeps the GPU copier's thread and the landing threads
// (two asked for) on the io threads' CPUs (here one, by FERRY_IO_CPUS);
// unset, they are left where the process may run.
TEST(Gpu, HelperThreadsGoOnTheIoThreadsCpusWhereAsked) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> allowed = cpus::Allowed();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs to tell a confined thread apart";
  const std::vector<int> io{allowed.back()};
  for (const bool confine : {true, false}) {
    SCOPED_TRACE(confine ? "confined" : "not confined");
    setenv("FERRY_IO_CPUS", std::to_string(io[0]).c_str(), 1);
    if (confine) setenv("FERRY_HELPER_CPUS", "1", 1);
    EngineOptions o;
    o.landing_threads = 2;
    auto e = Engine::Create(o);
    unsetenv("FERRY_HELPER_CPUS");  // before any assertion can return
    unsetenv("FERRY_IO_CPUS");
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (const char* name : {"ferry-copier", "ferry-landing"}) {
      const auto threads = test::CpusOfThreadsNamed(name);
      EXPECT_FALSE(threads.empty()) << name;
      for (const auto& cpus : threads) EXPECT_EQ(cpus, confine ? io : allowed) << name;
    }
  }
}

#else
TEST(Gpu, BuiltWithoutCuda) { GTEST_SKIP() << "built without a CUDA toolkit"; }
#endif

}  // namespace
}  // namespace ferry
