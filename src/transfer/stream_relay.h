// Stream-ordered transfers whose bytes the CPU moves: tcp, shm, or host memory
// on both sides (DESIGN.md R5). Everything GPU-side goes on the caller's
// stream at submit, one window of chunks at a time:
//
//   [device-to-staging copies of the window's writes]
//   signal: gpu_flag = seq        the CPU now sends or fetches the window
//   wait:   cpu_flag >= seq       released by the CPU once the window is done
//   [staging-to-device copies of the window's reads]
//   ... next window ...
//   signal: gpu_flag = final      the batch is complete
//
// The wait depends only on the network or another process. Engine threads
// make no CUDA call here: they read and write the flags, page-locked words.
// Staging and flags come from slots made once, when the engine starts (R4).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"
#include "transfer/batch.h"

namespace ferry {

namespace gpu {
class Copier;
}
class Endpoint;

class StreamRelay {
 public:
  // One task-sized piece of a request. `staged` is set when the local side
  // is GPU memory: it is staged through the slot on the caller's stream.
  struct Chunk {
    std::shared_ptr<Endpoint> endpoint;
    Op op = Op::kRead;
    char* local = nullptr;  // host memory, or GPU memory when staged
    bool staged = false;
    uint64_t remote = 0;
    uint64_t length = 0;
    uint32_t index = 0;       // request index in the batch
    bool gpu_remote = false;  // as Task::gpu_remote
  };

  // The error of the allocation when the slots cannot be had.
  static Result<std::unique_ptr<StreamRelay>> Create(gpu::Copier* copier, size_t slots,
                                                     size_t slot_bytes, Millis request_timeout);
  ~StreamRelay();

  size_t slot_bytes() const;

  // Enqueues the windows on `stream` and returns at once. Each request named
  // by a chunk must be planned with one task in `state`; it completes once
  // the stream has passed the whole batch. Waits at most until `deadline`
  // for a free slot (Unavailable after it). On an error nothing waits on the
  // stream and no request is completed.
  Status Submit(void* stream, std::vector<Chunk> chunks, std::shared_ptr<BatchState> state,
                Deadline deadline);

  class Core;

 private:
  explicit StreamRelay(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

}  // namespace ferry
