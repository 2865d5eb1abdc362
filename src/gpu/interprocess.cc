#include "gpu/interprocess.h"

#if FERRY_HAVE_CUDA

#include <cstring>

#include "gpu/cuda_util.h"
#include "gpu/gpu.h"

namespace ferry::gpu {
namespace {

Status Cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

Result<std::unique_ptr<IpcEvent>> IpcEvent::Create(int device) {
  if (device < 0 || device >= DeviceCount()) {
    return Status::NotSupported("no GPU " + std::to_string(device));
  }
  DeviceGuard guard(device);
  cudaEvent_t ev = nullptr;
  FERRY_RETURN_IF_ERROR(
      Cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess),
           "cudaEventCreateWithFlags"));
  cudaIpcEventHandle_t h;
  if (Status st = Cuda(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle"); !st.ok()) {
    cudaEventDestroy(ev);
    return st;
  }
  return std::unique_ptr<IpcEvent>(
      new IpcEvent(device, ev, std::string(reinterpret_cast<const char*>(&h), sizeof(h))));
}

IpcEvent::~IpcEvent() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }

Status IpcEvent::Record(void* stream) {
  DeviceGuard guard(device_);
  return Cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
              "cudaEventRecord");
}

Status IpcEvent::Synchronize() {
  return Cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize");
}

Result<std::unique_ptr<IpcStream>> IpcStream::Create(int device) {
  if (device < 0 || device >= DeviceCount()) {
    return Status::InvalidArgument("no GPU " + std::to_string(device) + " here");
  }
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  FERRY_RETURN_IF_ERROR(
      Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  return std::unique_ptr<IpcStream>(new IpcStream(device, s));
}

IpcStream::~IpcStream() {
  DeviceGuard guard(device_);
  if (opened_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(opened_));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status IpcStream::WaitPeerEvent(const std::string& handle) {
  cudaIpcEventHandle_t h;
  if (handle.size() != sizeof(h)) return Status::InvalidArgument("bad event handle");
  DeviceGuard guard(device_);
  if (opened_ == nullptr || handle != opened_handle_) {
    // A client keeps one event per device, so this opens once per client.
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t ev = nullptr;
    FERRY_RETURN_IF_ERROR(Cuda(cudaIpcOpenEventHandle(&ev, h), "cudaIpcOpenEventHandle"));
    if (opened_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(opened_));
    opened_ = ev;
    opened_handle_ = handle;
  }
  return Cuda(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(opened_), 0),
      "cudaStreamWaitEvent");
}

Result<int> StreamDevice(void* stream) {
  int device = -1;
  if (stream == nullptr) {
    FERRY_RETURN_IF_ERROR(Cuda(cudaGetDevice(&device), "cudaGetDevice"));
    return device;
  }
  FERRY_RETURN_IF_ERROR(
      Cuda(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device), "cudaStreamGetDevice"));
  return device;
}

Result<bool> StreamCapturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FERRY_RETURN_IF_ERROR(Cuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status),
                             "cudaStreamIsCapturing"));
  return status != cudaStreamCaptureStatusNone;
}

Result<bool> StreamIdle(int device, void* stream) {
  DeviceGuard guard(device);
  const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    // Not a failure, and it must not linger as the error a framework's next
    // launch check finds (PyTorch's Stream.query clears it the same way).
    (void)cudaGetLastError();
    return false;
  }
  FERRY_RETURN_IF_ERROR(Cuda(e, "cudaStreamQuery"));
  return false;
}

Status CopyOnStream(void* dst, const void* src, size_t length, void* stream) {
  return Cuda(
      cudaMemcpyAsync(dst, src, length, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
      "cudaMemcpyAsync");
}

Status WaitStream(void* stream) {
  return Cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

Status CopyOnStreamAndWait(void* dst, const void* src, size_t length, void* stream) {
  FERRY_RETURN_IF_ERROR(CopyOnStream(dst, src, length, stream));
  return WaitStream(stream);
}

}  // namespace ferry::gpu

#else  // no CUDA at build time: there is no GPU

namespace ferry::gpu {

namespace {
Status NoCuda() { return Status::NotSupported("built without CUDA"); }
}  // namespace

Result<std::unique_ptr<IpcEvent>> IpcEvent::Create(int) { return NoCuda(); }
IpcEvent::~IpcEvent() = default;
Status IpcEvent::Record(void*) { return NoCuda(); }
Status IpcEvent::Synchronize() { return NoCuda(); }
Result<std::unique_ptr<IpcStream>> IpcStream::Create(int) { return NoCuda(); }
IpcStream::~IpcStream() = default;
Status IpcStream::WaitPeerEvent(const std::string&) { return NoCuda(); }
Result<int> StreamDevice(void*) { return NoCuda(); }
Result<bool> StreamCapturing(void*) { return NoCuda(); }
Result<bool> StreamIdle(int, void*) { return NoCuda(); }
Status CopyOnStream(void*, const void*, size_t, void*) { return NoCuda(); }
Status WaitStream(void*) { return NoCuda(); }
Status CopyOnStreamAndWait(void*, const void*, size_t, void*) { return NoCuda(); }

}  // namespace ferry::gpu

#endif
