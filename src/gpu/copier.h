// GPU copies for the engine, following the stream-ordering contract of
// DESIGN.md: readiness is an event recorded on the caller's stream at submit
// (R1, R2); the engine's copies run on private non-blocking streams that wait
// on it on the GPU; completion is seen by polling events, so no engine thread
// blocks in CUDA or touches the legacy stream (R4). Streams and events are
// created once, when the Copier is, and pooled (R4, R6).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ferry/status.h"

namespace ferry::gpu {

// An event recorded on a caller's stream. Shared by the tasks of one batch.
class ReadyEvent;

class Copier {
 public:
  // NotSupported when there is no GPU.
  static Result<std::unique_ptr<Copier>> Create();
  virtual ~Copier() = default;

  // Records an event on `stream` (a cudaStream_t; null is the legacy default
  // stream) without blocking. The device is the stream's.
  virtual Result<std::shared_ptr<ReadyEvent>> RecordReady(void* stream) = 0;

  // Enqueues dst <- src (any mix of host and device memory) on a private stream
  // of `device`, after `ready` when it is set, and returns at once. `done` runs
  // on the Copier's completion thread once the bytes have landed, or with the
  // CUDA error.
  virtual void CopyAsync(void* dst, const void* src, size_t length, int device,
                         std::shared_ptr<ReadyEvent> ready,
                         std::function<void(const Status&)> done) = 0;

  // CopyAsync, then looks for the copy's end on this thread, on its core,
  // for up to `look_us`: `done` runs here if the copy ended by then, else on
  // the completion thread. For a thread that has the core now and would
  // otherwise leave the look to the completion thread, which may not.
  virtual void CopyAndLook(void* dst, const void* src, size_t length, int device,
                           std::shared_ptr<ReadyEvent> ready, int look_us,
                           std::function<void(const Status&)> done) = 0;

  struct Copy {
    void* dst;
    const void* src;
    size_t length;
    std::function<void(const Status&)> done;
  };
  // CopyAsync for several copies on one device, all after `ready`: each stream
  // used waits on it once and records one completion for its share, so a
  // small copy costs one enqueue. A batch of few bytes takes one stream, a
  // large one is spread over several so that its copies overlap. Each copy's
  // `done` runs exactly once.
  virtual void CopyManyAsync(std::vector<Copy> copies, int device,
                             std::shared_ptr<ReadyEvent> ready) = 0;

  // Copies enqueued one after another on one private stream of a device,
  // all after `ready`: each Add costs the calling thread one enqueue and no
  // completion of its own; End runs `done` on the completion thread once
  // every copy added has landed, or with the first error (an Add that fails
  // returns it, and every later Add and the End report it). For a receive
  // that hands its bytes on as they come in. Not thread safe; End exactly
  // once.
  class Run {
   public:
    virtual ~Run() = default;
    virtual Status Add(void* dst, const void* src, size_t length) = 0;
    virtual void End(std::function<void(const Status&)> done) = 0;
  };
  virtual std::unique_ptr<Run> StartRun(int device, std::shared_ptr<ReadyEvent> ready) = 0;

  // Stream-ordered path (R5). OK when copies may be enqueued on `stream`;
  // NotSupported while it is being captured into a graph.
  virtual Status CheckStream(void* stream) = 0;
  // Enqueues dst <- src on the caller's `stream` itself; never waits.
  virtual Status EnqueueOnStream(void* stream, void* dst, const void* src, size_t length) = 0;
  // Runs `done` on the completion thread once the work enqueued on `stream`
  // so far has finished.
  virtual void NotifyOnStream(void* stream, std::function<void(const Status&)> done) = 0;
  // Enqueues on `stream` a write of `value` to the page-locked host word
  // `flag`, after the work before it (cuStreamWriteValue32, fenced). The CPU
  // sees it by reading the word: no CUDA call is needed to observe progress.
  virtual Status SignalOnStream(void* stream, uint32_t* flag, uint32_t value) = 0;
  // Enqueues on `stream` a wait until the page-locked host word `flag`,
  // compared cyclically, reaches `value` (cuStreamWaitValue32, GEQ). R5: only
  // CPU progress may release it, never GPU work of this process.
  virtual Status WaitOnStream(void* stream, const uint32_t* flag, uint32_t value) = 0;

  // Keeps the completion thread on any of `cpus` from now on.
  virtual Status ConfineThread(const std::vector<int>& cpus) = 0;
};

}  // namespace ferry::gpu
