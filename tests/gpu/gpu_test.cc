// GPU tests. On a machine without a GPU (CI) every test reports itself as
// skipped with the reason; the no-GPU checks run everywhere.
#include "gpu/gpu.h"

#include <gtest/gtest.h>

#include <vector>

#include "ferry/engine.h"

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

TEST(Gpu, DeviceMemoryIsRefusedWithAClearErrorUntilTheGpuPathsLand) {
  SKIP_WITHOUT_GPU();
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1 << 20), cudaSuccess);
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.value()->RegisterMemory(dev, 1 << 20).code(), StatusCode::kNotSupported);
  auto mem = e.value()->AllocateMemory(1 << 20);
  ASSERT_TRUE(mem.ok());
  auto seg = e.value()->OpenSegment(e.value()->name());
  ASSERT_TRUE(seg.ok());
  auto b = e.value()->Submit(std::vector<Request>{
      {Op::kRead, dev, seg.value(), reinterpret_cast<uint64_t>(mem.value()), 4096}});
  EXPECT_EQ(b.status().code(), StatusCode::kNotSupported) << b.status().ToString();
  cudaFree(dev);
}
#else
TEST(Gpu, BuiltWithoutCuda) { GTEST_SKIP() << "built without a CUDA toolkit"; }
#endif

}  // namespace
}  // namespace ferry
