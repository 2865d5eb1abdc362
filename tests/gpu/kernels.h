// Test kernels: producers that are still running when a transfer is submitted.
#pragma once

#include <cstddef>

namespace ferry::test {

// On `stream` (a cudaStream_t): spins for about `ns` nanoseconds, then fills
// p[0, n) with `value`.
void LaunchSpinThenFill(void* p, size_t n, unsigned char value, long long ns, void* stream);

// Launches the k-th of kFreshKernels distinct kernels (each adds 1 to p[0]),
// so a test can enqueue a kernel that has never been launched in the process:
// under lazy module loading, its first launch loads it.
inline constexpr int kFreshKernels = 16;
void LaunchFresh(int k, unsigned char* p, void* stream);

}  // namespace ferry::test
