#include <cuda_runtime.h>

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

}  // namespace

void LaunchSpinThenFill(void* p, size_t n, unsigned char value, long long ns, void* stream) {
  SpinThenFill<<<32, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned char*>(p),
                                                                   n, value, ns);
}

}  // namespace ferry::test
