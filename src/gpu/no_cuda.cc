// Built when no CUDA toolkit was found at configure time: there is no GPU.
#include "gpu/gpu.h"

namespace ferry::gpu {

int DeviceCount() { return 0; }
std::string Describe() { return "no GPU: built without CUDA"; }
MemoryInfo Classify(const void*) { return {}; }

}  // namespace ferry::gpu
