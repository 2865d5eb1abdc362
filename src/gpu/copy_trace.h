// What traced runs (FERRY_TRACE_FILE, common/event_trace.h) learn from the
// GPU copier: when its copies into GPU memory ran on the GPU, how long each
// copy took to enqueue, and where its completion thread's time goes.
// Untraced, each costs a branch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/event_trace.h"

namespace ferry::gpu {

// One device's event times on the host's steady clock.
class GpuClock {
 public:
  // Times an anchor event on the idle stream `s`: the middle of its record
  // and its sync, a few us either way. The one wait in CUDA the copier
  // makes, once, when it is created.
  cudaError_t Start(cudaStream_t s);
  // Frees the anchor; call with the device current.
  void Release();
  // Marks a finished copy into GPU memory (stages kGpuCopyInStart, End),
  // timed by `start` and `end` on its stream, with its destination as `key`.
  void MarkCopyIn(uint64_t key, cudaEvent_t start, cudaEvent_t end) const;

 private:
  cudaEvent_t anchor_ = nullptr;
  int64_t anchor_ns_ = 0;
};

// cudaMemcpyAsync, its enqueue timed as `stage` in traced runs.
inline cudaError_t TimedCopy(trace::Stage stage, void* dst, const void* src, size_t n,
                             cudaMemcpyKind kind, cudaStream_t s) {
  trace::SizedSpan timed(stage, n);
  return cudaMemcpyAsync(dst, src, n, kind, s);
}

// Where the completion thread's time goes while copies are pending. Marks,
// with the span in ns as the key, a look whose CUDA queries or done
// callbacks took over 30 us in all, and a gap of over 30 us between a look
// that left copies pending and the next.
class LookTimer {
 public:
  void LookStarts() {
    if (!trace::On()) return;
    const int64_t now = trace::NowNs();
    if (pending_ && now - end_ > kSlow) trace::MarkAt(trace::kCopierAway, now - end_, now);
    query_ns_ = call_ns_ = 0;
  }
  void Query() { Start(); }
  void Queried() { Stop(&query_ns_); }
  void Call() { Start(); }
  void Called() { Stop(&call_ns_); }
  void LookEnds(bool pending) {
    if (!trace::On()) return;
    end_ = trace::NowNs();
    pending_ = pending;
    if (query_ns_ > kSlow) trace::MarkAt(trace::kCopierQueries, query_ns_, end_);
    if (call_ns_ > kSlow) trace::MarkAt(trace::kCopierCallbacks, call_ns_, end_);
  }

 private:
  static constexpr int64_t kSlow = 30'000;
  void Start() {
    if (trace::On()) at_ = trace::NowNs();
  }
  void Stop(int64_t* sum) {
    if (trace::On()) *sum += trace::NowNs() - at_;
  }
  int64_t at_ = 0, end_ = 0, query_ns_ = 0, call_ns_ = 0;
  bool pending_ = false;
};

}  // namespace ferry::gpu
