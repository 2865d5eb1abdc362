// Test kernels: producers that are still running when a transfer is submitted.
#pragma once

#include <cstddef>

namespace ferry::test {

// On `stream` (a cudaStream_t): spins for about `ns` nanoseconds, then fills
// p[0, n) with `value`.
void LaunchSpinThenFill(void* p, size_t n, unsigned char value, long long ns, void* stream);

}  // namespace ferry::test
