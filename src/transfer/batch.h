// Batch bookkeeping shared by the engine and its transports. A request is cut
// into tasks; each task is completed exactly once, by whichever transport took
// it. The state outlives the user's Batch handle while transports hold tasks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "ferry/types.h"
#include "gpu/copier.h"

namespace ferry {

class BatchState {
 public:
  explicit BatchState(size_t requests);

  // Before any task of request `index` is posted: how many there will be.
  void Plan(size_t index, uint32_t tasks, std::string_view transport);
  // Fails a request that will get no task.
  void FailRequest(size_t index, Status status);
  // One call per planned task. The first error of a request wins.
  void TaskDone(size_t index, const Status& status);

  size_t size() const { return requests_.size(); }
  BatchStatus Poll() const;
  RequestResult Result(size_t index) const;
  // True once every request is done, false at the deadline.
  bool WaitDone(Deadline deadline);
  // Marks the batch cancelled: tasks not started yet complete as Cancelled.
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Blocks until no task is held by a transport, i.e. no buffer is touched.
  bool WaitQuiescent(Deadline deadline);
  // The latest deadline of any planned task, bounding WaitQuiescent.
  void NoteDeadline(Deadline d);
  Deadline latest_deadline() const;

 private:
  // A task's completion touches only atomics unless it failed; the lock is
  // taken for errors and for the one wake-up a batch's end needs. With eight
  // lanes' io threads completing tasks at once, a shared mutex made them
  // sleep on each other (futex waits on the H200, issue 16).
  struct Req {
    std::atomic<uint32_t> tasks_left{0};
    std::atomic<bool> failed{false};  // status holds why; set under mu_
    std::atomic<bool> done{false};
    Status status;                              // guarded by mu_
    std::string_view transport = kNoTransport;  // set by Plan, before any task runs
  };
  // Request `r`'s last task has completed: counts it; true when it was the
  // batch's last request.
  bool Finish(Req& r);
  // Wakes the waiters; taking mu_ first, so a waiter between its check and
  // its sleep cannot miss it.
  void Wake();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Req> requests_;
  std::atomic<size_t> succeeded_{0};
  std::atomic<size_t> failed_{0};  // changed under mu_, with first_error_
  std::atomic<size_t> tasks_outstanding_{0};
  Status first_error_;                         // guarded by mu_
  Deadline latest_{Clock::time_point::min()};  // guarded by mu_
  std::atomic<bool> cancelled_{false};
  std::atomic<size_t> finished_{0};  // requests counted; the last to count wakes the waiters
};

// The unit a transport moves: a slice of one request.
struct Task {
  Op op = Op::kRead;
  char* local = nullptr;
  uint64_t remote = 0;
  uint64_t length = 0;
  uint32_t index = 0;  // request index within the batch
  Deadline deadline;
  std::shared_ptr<BatchState> batch;
  // GPU memory on either side: the device that copies, and the readiness event
  // recorded on the submission stream (null when the caller opted out).
  int gpu_device = -1;
  bool gpu_local = false;   // the local side is the GPU memory
  bool gpu_remote = false;  // the remote side is GPU memory, which its target stages
  std::shared_ptr<gpu::ReadyEvent> ready;
  // Set on a stand-in task by a transport that stages the real one: runs
  // instead of the batch update, which the real task then does.
  std::shared_ptr<std::function<void(const Status&)>> on_done;
  // Set on a stand-in write whose buffer is the transport's: runs once the
  // payload has been handed to the socket, before any reply; may not run
  // at all where the task fails first.
  std::shared_ptr<std::function<void()>> on_sent;
  // Set on a stand-in read into the transport's staging: runs on the socket
  // thread for each `piece` bytes of the payload (the last may be short; 0:
  // the whole) once they are in, as (offset, length), all of them before a
  // successful Done. A checksummed read's payload goes whole, once checked.
  std::shared_ptr<std::function<void(uint64_t at, uint64_t n)>> on_piece;
  uint64_t piece = 0;
  // Set on a stand-in read into the transport's staging: the socket thread
  // writes each receive's bytes of the payload back for the DMA
  // (common/cache.h) as they come in.
  bool write_back_in = false;

  void Done(const Status& s) const {
    if (on_done) {
      (*on_done)(s);
    } else {
      batch->TaskDone(index, s);
    }
  }
};

}  // namespace ferry
