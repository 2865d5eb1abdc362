// Helpers for the files of src/gpu that call the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

namespace ferry::gpu {

// Makes `device` current for a scope and restores the caller's device after,
// so no Ferry call changes the current device of an application's thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (device != prev_) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (prev_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Lets `from` reach `to`'s memory directly (NVLink or PCIe peer-to-peer) where
// the hardware allows; otherwise copies between them are staged by CUDA.
inline void EnablePeerAccess(int from, int to) {
  int can = 0;
  if (from == to || cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess || !can) return;
  DeviceGuard g(from);
  if (cudaDeviceEnablePeerAccess(to, 0) != cudaSuccess) cudaGetLastError();  // already enabled
}

// A driver function, looked up through the runtime so libcuda is never
// linked; null where the driver lacks it.
template <typename Fn>
Fn DriverFunction(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

}  // namespace ferry::gpu
