// GPU tests. On a machine without a GPU (CI) every test reports itself as
// skipped with the reason; the no-GPU checks run everywhere.
#include "gpu/gpu.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "ferry/engine.h"
#include "gpu/kernels.h"

#ifdef FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (gpu::DeviceCount() == 0) GTEST_SKIP() << gpu::Describe()

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

// A device buffer as the producer, and the engine's own segment as the target
// (the local transport, the one GPU path so far).
class GpuLocal : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 1 << 20;

  void SetUp() override {
    if (gpu::DeviceCount() == 0) GTEST_SKIP() << gpu::Describe();
    auto e = Engine::Create({});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    ASSERT_EQ(cudaMalloc(&src_, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_dst_, kBytes), cudaSuccess);
    ASSERT_TRUE(engine_->RegisterMemory(dev_dst_, kBytes).ok());
    auto host = engine_->AllocateMemory(kBytes);  // memfd, page-locked
    ASSERT_TRUE(host.ok());
    host_dst_ = static_cast<unsigned char*>(host.value());
    auto seg = engine_->OpenSegment(engine_->name());
    ASSERT_TRUE(seg.ok());
    seg_ = seg.value();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming), cudaSuccess);
  }

  void TearDown() override {
    if (gpu::DeviceCount() == 0) return;
    cudaDeviceSynchronize();
    cudaEventDestroy(produced_);
    cudaStreamDestroy(stream_);
    cudaStreamDestroy(side_);
    cudaFree(src_);
    cudaFree(dev_dst_);
    engine_.reset();
  }

  bool AllEqual(const unsigned char* p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != v) return false;
    }
    return true;
  }

  // One round: a producer still running at submit fills src_ with `v`; the
  // engine writes src_ to `dst` in `pieces` requests. Returns whether `dst`
  // then holds `v`, and sets `pending` if the producer was unfinished at the call.
  bool Round(unsigned char v, int pieces, bool side_stream, bool already_ready, void* dst,
             bool* pending) {
    cudaStream_t producer = side_stream ? side_ : stream_;
    test::LaunchSpinThenFill(src_, kBytes, v, 2'000'000, producer);  // about 2 ms
    cudaEventRecord(produced_, producer);
    if (side_stream) cudaStreamWaitEvent(stream_, produced_, 0);  // the caller joins it
    std::vector<Request> reqs;
    const size_t piece = kBytes / static_cast<size_t>(pieces);
    for (int i = 0; i < pieces; ++i) {
      reqs.push_back({Op::kWrite, static_cast<char*>(src_) + i * piece, seg_,
                      reinterpret_cast<uint64_t>(dst) + i * piece, piece});
    }
    SubmitOptions o;
    o.stream = stream_;
    o.already_ready = already_ready;
    auto b = engine_->Submit(reqs, o);
    *pending = cudaEventQuery(produced_) == cudaErrorNotReady;
    if (!b.ok() || !b.value()->Wait(std::chrono::seconds(10)).ok()) return false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (b.value()->Result(i).transport != TransportKind::kLocal) return false;
    }
    if (dst == host_dst_) return AllEqual(host_dst_, kBytes, v);
    std::vector<unsigned char> back(kBytes);
    cudaMemcpy(back.data(), dst, kBytes, cudaMemcpyDeviceToHost);  // test thread only
    return AllEqual(back.data(), kBytes, v);
  }

  // 100 rounds; returns how many were correct, and checks the producer was
  // pending at every submit.
  int Rounds(int pieces, bool side_stream, bool already_ready, void* dst) {
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
  SegmentId seg_ = 0;
  void* src_ = nullptr;
  void* dev_dst_ = nullptr;
  unsigned char* host_dst_ = nullptr;
  cudaStream_t stream_ = nullptr, side_ = nullptr;
  cudaEvent_t produced_ = nullptr;
};

TEST_F(GpuLocal, ReadinessDeviceToHostSingleAndBatched) {
  EXPECT_EQ(Rounds(1, false, false, host_dst_), 100);
  EXPECT_EQ(Rounds(8, false, false, host_dst_), 100);
}

TEST_F(GpuLocal, ReadinessDeviceToDeviceSingleAndBatched) {
  EXPECT_EQ(Rounds(1, false, false, dev_dst_), 100);
  EXPECT_EQ(Rounds(8, false, false, dev_dst_), 100);
}

TEST_F(GpuLocal, ReadinessWithAProducerOnASideStreamJoinedByAnEvent) {
  EXPECT_EQ(Rounds(1, true, false, host_dst_), 100);
  EXPECT_EQ(Rounds(8, true, false, dev_dst_), 100);
}

TEST_F(GpuLocal, ControlWithoutReadinessReadsStaleData) {
  // Proves the readiness test can fail: opting out copies before the producer.
  int correct = Rounds(1, false, true, host_dst_);
  EXPECT_LT(correct, 100);
}

TEST_F(GpuLocal, NoStallBehindAKernelOnABlockingStream) {
  cudaStream_t blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, 4096), cudaSuccess);
  cudaMemset(src_, 7, 4096);
  cudaDeviceSynchronize();
  test::LaunchSpinThenFill(scratch, 4096, 1, 1'000'000'000, blocking);  // about 1 s
  auto t0 = std::chrono::steady_clock::now();
  SubmitOptions o;
  o.stream = stream_;  // idle; any stream but the legacy default
  auto b = engine_->Submit(
      std::vector<Request>{{Op::kWrite, src_, seg_, reinterpret_cast<uint64_t>(host_dst_), 4096}},
      o);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b.value()->Wait(std::chrono::seconds(10)).ok());
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  bool kernel_running = cudaStreamQuery(blocking) == cudaErrorNotReady;
  EXPECT_TRUE(kernel_running);
  EXPECT_LT(ms, 5.0);
  EXPECT_TRUE(AllEqual(host_dst_, 4096, 7));
  RecordProperty("no_stall_ms", std::to_string(ms));
  cudaStreamSynchronize(blocking);
  cudaStreamDestroy(blocking);
  cudaFree(scratch);
}

TEST_F(GpuLocal, GpuMemoryOverTcpOrShmIsRefusedClearly) {
  for (const char* t : {"tcp", "shm"}) {
    EngineOptions o;
    o.transport = t;
    auto other = Engine::Create(o);
    ASSERT_TRUE(other.ok());
    auto seg = other.value()->OpenSegment(engine_->name());
    ASSERT_TRUE(seg.ok());
    std::vector<char> host(4096);
    // Remote GPU memory, and local GPU memory.
    for (Request r :
         {Request{Op::kWrite, host.data(), seg.value(), reinterpret_cast<uint64_t>(dev_dst_), 4096},
          Request{Op::kWrite, src_, seg.value(), reinterpret_cast<uint64_t>(host_dst_), 4096}}) {
      auto b = other.value()->Submit(std::vector<Request>{r});
      ASSERT_TRUE(b.ok());
      Status st = b.value()->Wait(std::chrono::seconds(5));
      EXPECT_EQ(st.code(), StatusCode::kNotSupported) << t << ": " << st.ToString();
    }
  }
}
#else
TEST(Gpu, BuiltWithoutCuda) { GTEST_SKIP() << "built without a CUDA toolkit"; }
#endif

}  // namespace
}  // namespace ferry
