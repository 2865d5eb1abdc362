// Device probing and pointer classification with the CUDA runtime, linked
// statically. Driver functions come through cudaGetDriverEntryPoint, so the
// binary never links libcuda and starts on a machine without a driver.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "common/cache.h"
#include "gpu/copy_trace.h"
#include "gpu/cuda_util.h"
#include "gpu/gpu.h"

namespace ferry::gpu {
namespace {

struct Probe {
  int count = 0;
  std::string description;
  // cuMemGetAddressRange, from the driver at run time.
  CUresult (*get_address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
};

const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n <= 0) {
      cudaGetLastError();  // clear the sticky error
      p.description = std::string("no GPU: ") +
                      (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
      return p;
    }
    p.count = n;
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    p.description = "CUDA runtime " + std::to_string(runtime / 1000) + "." +
                    std::to_string(runtime % 1000 / 10) + ", driver " +
                    std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) +
                    ", " + std::to_string(n) + " device(s)";
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
        p.description += std::string(d == 0 ? ": " : ", ") + prop.name;
      }
    }
    p.get_address_range = DriverFunction<decltype(p.get_address_range)>("cuMemGetAddressRange");
    return p;
  }();
  return probe;
}

}  // namespace

int DeviceCount() { return GetProbe().count; }
std::string Describe() { return GetProbe().description; }

bool PinHost(void* p, size_t length) {
  if (DeviceCount() == 0) return false;
  if (cudaHostRegister(p, length, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

void UnpinHost(void* p) {
  if (DeviceCount() > 0 && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

std::string ExportIpc(const MemoryInfo& info) {
  if (info.kind != MemoryKind::kDevice || info.alloc_base == 0) return {};
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(info.alloc_base)) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

namespace {
std::atomic<int64_t> ipc_open{0};
std::atomic<uint64_t> ipc_opened{0};
}  // namespace

IpcImportCounts IpcImports() {
  return {ipc_open.load(std::memory_order_relaxed), ipc_opened.load(std::memory_order_relaxed)};
}

Result<void*> OpenIpc(const std::string& handle, int device) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) return Status::InvalidArgument("bad IPC handle");
  std::memcpy(&h, handle.data(), sizeof(h));
  DeviceGuard guard(device);
  void* p = nullptr;
  cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(err));
  }
  ipc_open.fetch_add(1, std::memory_order_relaxed);
  ipc_opened.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void CloseIpc(void* base, int device) {
  DeviceGuard guard(device);
  if (cudaIpcCloseMemHandle(base) != cudaSuccess) cudaGetLastError();
  ipc_open.fetch_sub(1, std::memory_order_relaxed);
}

Result<void*> AllocDevice(size_t length, int device) {
  if (DeviceCount() == 0) return Status::NotSupported(Describe());
  DeviceGuard guard(device);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, length);
  if (err != cudaSuccess) {
    return Status::ResourceExhausted(std::string("cudaMalloc: ") + cudaGetErrorString(err));
  }
  // Zeroed on a private stream: no legacy-stream or device-wide sync (R4, R6).
  cudaStream_t s = nullptr;
  err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, length, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (s != nullptr) cudaStreamDestroy(s);
  if (err != cudaSuccess) {
    cudaFree(p);
    return Status::Internal(std::string("zeroing: ") + cudaGetErrorString(err));
  }
  return p;
}

void FreeDevice(void* p) { cudaFree(p); }

Result<void*> AllocPinned(size_t length) {
  void* p = nullptr;
  cudaError_t err = cudaMallocHost(&p, length);
  if (err != cudaSuccess) {
    return Status::ResourceExhausted(std::string("cudaMallocHost: ") + cudaGetErrorString(err));
  }
  return p;
}

void FreePinned(void* p) { cudaFreeHost(p); }

namespace {

class CudaStagedPipe : public StagedPipe {
 public:
  explicit CudaStagedPipe(int device) : device_(device) {}
  ~CudaStagedPipe() override {
    DeviceGuard guard(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
      if (done_[i] != nullptr) cudaEventDestroy(done_[i]);
      if (buf_[i] != nullptr) cudaFreeHost(buf_[i]);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaError_t Init(size_t block) {
    DeviceGuard guard(device_);
    cudaError_t err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    for (int i = 0; i < 2 && err == cudaSuccess; ++i) {
      err = cudaMallocHost(reinterpret_cast<void**>(&buf_[i]), block);
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming);
    }
    return err;
  }

  char* buffer(int slot) override { return buf_[slot & 1]; }
  Status Fetch(int slot, const void* src, size_t n) override {
    return Copy(slot, buf_[slot & 1], src, n, cudaMemcpyDeviceToHost);
  }
  Status Store(int slot, size_t at, void* dst, size_t n) override {
    return Copy(slot, dst, buf_[slot & 1] + at, n, cudaMemcpyHostToDevice);
  }
  Status Wait(int slot) override {
    return Check(cudaEventSynchronize(done_[slot & 1]), "cudaEventSynchronize");
  }

 private:
  static Status Check(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return Status::Ok();
    return Status::Internal(std::string("staged reference: ") + what + ": " +
                            cudaGetErrorString(err));
  }
  Status Copy(int slot, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    DeviceGuard guard(device_);
    cudaError_t err = TimedCopy(trace::kRefCopyEnqueued, dst, src, n, kind, stream_);
    if (err == cudaSuccess) err = cudaEventRecord(done_[slot & 1], stream_);
    return Check(err, "cudaMemcpyAsync");
  }

  const int device_;
  cudaStream_t stream_ = nullptr;
  char* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
};

}  // namespace

Result<std::unique_ptr<StagedPipe>> StagedPipe::Create(int device, size_t block) {
  if (DeviceCount() == 0) return Status::NotSupported(Describe());
  auto pipe = std::make_unique<CudaStagedPipe>(device);
  cudaError_t err = pipe->Init(block);
  if (err != cudaSuccess) {
    return Status::ResourceExhausted(std::string("staged reference: ") + cudaGetErrorString(err));
  }
  return std::unique_ptr<StagedPipe>(std::move(pipe));
}

Result<double> CopyBandwidth(int src_device, int dst_device, size_t block, double seconds,
                             int per_sync) {
  if (DeviceCount() == 0) return Status::NotSupported(Describe());
  DeviceGuard guard(src_device >= 0 ? src_device : std::max(dst_device, 0));
  auto alloc = [&](int device, void** p) {
    if (device < 0) return cudaMallocHost(p, block);
    DeviceGuard on(device);
    return cudaMalloc(p, block);
  };
  if (src_device >= 0 && dst_device >= 0) EnablePeerAccess(src_device, dst_device);
  void *src = nullptr, *dst = nullptr;
  cudaStream_t s = nullptr;
  cudaError_t err = alloc(src_device, &src);
  if (err == cudaSuccess) err = alloc(dst_device, &dst);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  double gbps = 0;
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(dst, src, block, cudaMemcpyDefault, s);  // warm-up
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    uint64_t bytes = 0;
    auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (err == cudaSuccess && elapsed < seconds) {
      for (int i = 0; i < std::max(per_sync, 1) && err == cudaSuccess; ++i) {
        err = cudaMemcpyAsync(dst, src, block, cudaMemcpyDefault, s);
        bytes += block;
      }
      if (err == cudaSuccess) err = cudaStreamSynchronize(s);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    gbps = static_cast<double>(bytes) / elapsed / 1e9;
  }
  if (s != nullptr) cudaStreamDestroy(s);
  for (auto [p, device] : {std::pair{src, src_device}, std::pair{dst, dst_device}}) {
    if (p == nullptr) continue;
    if (device < 0) {
      cudaFreeHost(p);
    } else {
      cudaFree(p);
    }
  }
  if (err != cudaSuccess) {
    return Status::Internal(std::string("reference copy: ") + cudaGetErrorString(err));
  }
  return gbps;
}

Result<double> StagingBandwidth(int out_device, int in_device, size_t block, double seconds,
                                size_t span, const std::function<bool()>& more) {
  if (out_device < 0 && in_device < 0) return Status::InvalidArgument("no GPU end to stage");
  if (DeviceCount() == 0) return Status::NotSupported(Describe());
  const size_t slots = std::max<size_t>(1, span / block);
  // One trip each: device to host (out) and host to device (in).
  struct Trip {
    int device = -1;
    bool out = false;
    void* dev = nullptr;
    char* host = nullptr;
    size_t next = 0;  // the slot of the host region the next copy takes
    cudaStream_t stream = nullptr;
  };
  std::vector<Trip> trips;
  if (out_device >= 0) trips.push_back({out_device, true});
  if (in_device >= 0) trips.push_back({in_device, false});
  cudaError_t err = cudaSuccess;
  auto each = [&](auto&& step) {
    for (Trip& t : trips) {
      if (err != cudaSuccess) return;
      DeviceGuard guard(t.device);
      err = step(t);
    }
  };
  auto copy = [&](Trip& t) {
    char* host = t.host + (t.next++ % slots) * block;
    return t.out ? cudaMemcpyAsync(host, t.dev, block, cudaMemcpyDeviceToHost, t.stream)
                 : cudaMemcpyAsync(t.dev, host, block, cudaMemcpyHostToDevice, t.stream);
  };
  auto sync = [](Trip& t) { return cudaStreamSynchronize(t.stream); };
  each([&](Trip& t) {
    cudaError_t e = cudaMalloc(&t.dev, block);
    if (e == cudaSuccess) e = cudaMallocHost(reinterpret_cast<void**>(&t.host), slots * block);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking);
    return e;
  });
  each(copy);  // warm-up
  each(sync);
  uint64_t bytes = 0;
  double elapsed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {  // at least one round, whatever `seconds`
    for (int i = 0; i < 8; ++i) each(copy);
    each(sync);
    bytes += 8 * block;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (err == cudaSuccess && (more ? more() : elapsed < seconds));
  for (Trip& t : trips) {
    DeviceGuard guard(t.device);
    if (t.stream != nullptr) cudaStreamDestroy(t.stream);
    if (t.host != nullptr) cudaFreeHost(t.host);
    if (t.dev != nullptr) cudaFree(t.dev);
  }
  if (err != cudaSuccess) {
    return Status::Internal(std::string("staging reference: ") + cudaGetErrorString(err));
  }
  return static_cast<double>(bytes) / elapsed / 1e9;
}

Result<double> CopyInFromWrittenBandwidth(int device, size_t block, double seconds,
                                          bool write_back) {
  if (DeviceCount() == 0) return Status::NotSupported(Describe());
  if (device < 0 || device >= DeviceCount()) return Status::InvalidArgument("no such GPU");
  constexpr int kRound = 8;
  DeviceGuard guard(device);
  char* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  cudaError_t err = cudaMalloc(&dev, block);
  if (err == cudaSuccess) err = cudaMallocHost(reinterpret_cast<void**>(&host), kRound * block);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaEventCreate(&begin);
  if (err == cudaSuccess) err = cudaEventCreate(&end);
  uint64_t bytes = 0;
  double gpu_s = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0; err == cudaSuccess; ++round) {
    // Written as a receive leaves them: every line dirty in this CPU's cache.
    for (int i = 0; i < kRound; ++i) {
      char* b = host + static_cast<size_t>(i) * block;
      std::memset(b, round + i, block);
      if (write_back) WriteBackOwnForDma(b, block);
    }
    err = cudaEventRecord(begin, stream);
    for (int i = 0; err == cudaSuccess && i < kRound; ++i) {
      err = cudaMemcpyAsync(dev, host + static_cast<size_t>(i) * block, block,
                            cudaMemcpyHostToDevice, stream);
    }
    if (err == cudaSuccess) err = cudaEventRecord(end, stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(end);
    float ms = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, begin, end);
    if (err != cudaSuccess) break;
    if (round == 0) continue;  // warm-up
    gpu_s += ms / 1e3;
    bytes += kRound * block;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds) {
      break;
    }
  }
  if (end != nullptr) cudaEventDestroy(end);
  if (begin != nullptr) cudaEventDestroy(begin);
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (host != nullptr) cudaFreeHost(host);
  if (dev != nullptr) cudaFree(dev);
  if (err != cudaSuccess) {
    return Status::Internal(std::string("copy-in reference: ") + cudaGetErrorString(err));
  }
  if (gpu_s <= 0) return Status::Internal("copy-in reference: no copy was timed");
  return static_cast<double>(bytes) / gpu_s / 1e9;
}

MemoryInfo Classify(const void* ptr) {
  MemoryInfo info;
  const Probe& probe = GetProbe();
  if (probe.count == 0) return info;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return info;
  }
  switch (attr.type) {
    case cudaMemoryTypeHost: info.kind = MemoryKind::kHostPinned; break;
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      info.kind = MemoryKind::kDevice;
      info.device = attr.device;
      if (probe.get_address_range != nullptr) {
        CUdeviceptr base = 0;
        size_t size = 0;
        if (probe.get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) ==
            CUDA_SUCCESS) {
          info.alloc_base = static_cast<uint64_t>(base);
          info.alloc_size = size;
        }
      }
      break;
    default: break;
  }
  return info;
}

}  // namespace ferry::gpu
