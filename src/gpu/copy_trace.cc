#include "gpu/copy_trace.h"

namespace ferry::gpu {

cudaError_t GpuClock::Start(cudaStream_t s) {
  cudaError_t err = cudaEventCreateWithFlags(&anchor_, cudaEventDefault);
  const int64_t before = trace::NowNs();
  if (err == cudaSuccess) err = cudaEventRecord(anchor_, s);
  if (err == cudaSuccess) err = cudaEventSynchronize(anchor_);
  anchor_ns_ = before + (trace::NowNs() - before) / 2;
  return err;
}

void GpuClock::Release() {
  if (anchor_ != nullptr) cudaEventDestroy(anchor_);
  anchor_ = nullptr;
}

void GpuClock::MarkCopyIn(uint64_t key, cudaEvent_t start, cudaEvent_t end) const {
  // From the anchor a float of ms loses a few us after a minute; the copy's
  // own length is timed apart.
  float since_ms = 0, copy_ms = 0;
  if (anchor_ == nullptr || cudaEventElapsedTime(&since_ms, anchor_, start) != cudaSuccess ||
      cudaEventElapsedTime(&copy_ms, start, end) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  const int64_t at = anchor_ns_ + static_cast<int64_t>(double{since_ms} * 1e6);
  trace::MarkAt(trace::kGpuCopyInStart, key, at);
  trace::MarkAt(trace::kGpuCopyInEnd, key, at + static_cast<int64_t>(double{copy_ms} * 1e6));
}

}  // namespace ferry::gpu
