#include <cuda_runtime.h>

#include <utility>

#include "gpu/kernels.h"

namespace ferry::test {
namespace {

__device__ long long GlobalNs() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinThenFill(unsigned char* p, size_t n, unsigned char value, long long ns) {
  const long long start = GlobalNs();
  while (GlobalNs() - start < ns) {
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = value;
  }
}

template <int K>
__global__ void Fresh(unsigned char* p) {
  p[0] = static_cast<unsigned char>(p[0] + 1 + K * 0);
}

template <int... Ks>
void LaunchFreshImpl(int k, unsigned char* p, cudaStream_t s, std::integer_sequence<int, Ks...>) {
  ((k == Ks ? (Fresh<Ks><<<1, 1, 0, s>>>(p), 0) : 0), ...);
}

}  // namespace

void LaunchFresh(int k, unsigned char* p, void* stream) {
  LaunchFreshImpl(k, p, static_cast<cudaStream_t>(stream),
                  std::make_integer_sequence<int, kFreshKernels>{});
}

void LaunchSpinThenFill(void* p, size_t n, unsigned char value, long long ns, void* stream) {
  SpinThenFill<<<32, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned char*>(p),
                                                                   n, value, ns);
}

}  // namespace ferry::test
