// Page-locked host buffers of one size, allocated once when their owner is
// made and reused, so GPU data paths never allocate or pin (R4). Shared by
// every peer of a tcp transport: the pinned memory is per engine, not per peer.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/status.h"

namespace ferry {

class ThreadPool;
namespace gpu {
class Copier;
class ReadyEvent;
}  // namespace gpu

class StagingPool {
 public:
  // The error of the allocation when the memory cannot be had (no GPU, or
  // cudaMallocHost failed).
  static Result<std::unique_ptr<StagingPool>> Create(size_t count, size_t bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  size_t buffer_bytes() const { return bytes_; }
  // The pinned bytes of every pool alive in this process.
  static size_t BytesHeld();

  // Calls `fn` with a buffer: now, on this thread, when one is free; else on
  // the thread of the Give that frees one, in request order. `fn` must not block.
  void Take(std::function<void(char*)> fn);
  // A free buffer now, or null. Never ahead of a waiting Take: Give hands a
  // buffer to the first waiter, so none is free while one waits.
  char* TryTake();
  void Give(char* buf);

 private:
  explicit StagingPool(size_t bytes) : bytes_(bytes) {}

  const size_t bytes_;
  std::vector<char*> all_;
  std::mutex mu_;
  std::vector<char*> free_;                         // guarded by mu_
  std::deque<std::function<void(char*)>> waiting_;  // guarded by mu_
};

// Where staging goes back before a request's reply (FERRY_TCP_EARLY_RELEASE,
// a bit mask, 0 by default): kReleaseOnSend, a staged write's buffer at the
// initiator once its bytes are sent, not once the target has acked them;
// kReleaseOnLanding, the target's buffer for a write to GPU memory once its
// copy has landed, not once the connection's thread has queued the ack.
inline constexpr int kReleaseOnSend = 1;
inline constexpr int kReleaseOnLanding = 2;
int EarlyRelease();

// FERRY_LANDING_LOOK_US (0 to 10000, default 0): how long a landing thread
// looks for its copy into the GPU to end before it leaves that to the
// copier's thread (Copier::CopyAndLook). A knob to compare.
int LandingLookUs();

// FERRY_READ_LANDING (0 or 1, default 1): 1 lands a read into GPU memory
// here on the socket thread that received it; 0 on the landing threads,
// as chunks into GPU memory at the target always do.
bool ReadsLandInline();

// FERRY_READ_PIECE_KIB (64 to 65536; unset, 0): where set, a read into
// GPU memory landing on the socket thread is copied a piece of this many
// KiB at a time, without the write-back, as its payload comes in
// (Task::on_piece), rather than whole once it is in. A knob to compare;
// read by each engine when it is made.
uint64_t ReadPieceBytes();

// FERRY_WRITEBACK_TAIL_KIB (0 to 65536; unset, 0: all): where set,
// LandStaged writes back only the last this many KiB of what it lands, the
// lines its receive most likely left in the core's private caches (older
// ones were pushed out by the later ones). A knob to compare.
uint64_t WriteBackTailBytes();

// FERRY_WRITEBACK_EAGER (0 or 1, default 0): 1 writes received staging
// back on the socket thread a receive at a time, as it comes in, unfenced:
// a whole read into GPU memory here (Task::write_back_in), a write into
// GPU memory at a target that fits one buffer. Its landing then writes
// nothing back. A knob to compare.
bool WriteBackEager();

// How a socket thread holds its landings (LandStaged). FERRY_LAND_DEFER
// (0 to 4; unset, 1), `depth`: where not 0, a landing on the socket thread
// that received it (a read into GPU memory here, a write into it at a
// target) is held on that thread until this many later ones have come,
// then lands without the write-back: their receives have pushed its lines
// out of the core's private caches. What a thread holds lands before it
// waits: once a lane of it has nothing on the wire, once a target's
// connection waits for its next frame (common/held_work.h). 0 lands at
// once, written back. FERRY_LAND_EARLY_WRITEBACK (0 or 1, default 1),
// `early_writes_back`: whether one landed early, because its thread is
// about to wait, writes its lines back first. 0, which skips it on
// the guess that a thread with nothing more to receive has no receive for
// the DMA's reads of its dirty lines to slow, lost on an H100 (2026-12-08:
// 1 MiB x 16 reads into GPU memory 0.668 -> 0.613 of host reads): on the
// batch's tail those reads cost more than the write-back. A knob to
// compare. Read by each engine when it is made.
struct LandHold {
  int depth = 0;
  bool early_writes_back = true;
};
LandHold LandHoldFromEnv();

// Moves `n` bytes just received into staging `buf` to GPU memory at `dst`:
// writes the buffer's cache lines back for the DMA (common/cache.h; inline,
// as the thread that received them: WriteBackOwnForDma), unless
// `written_back` says its receives did (WriteBackEager), then
// enqueues the host-to-device copy after `ready`. With a `pool`, both
// happen on one of its threads, so the socket thread that filled `buf`
// reads on at once: the write-back costs it about as long as the receive
// itself. Null: inline, or held on this thread for `hold.depth` later
// landings where that is > 0 and nothing was written back. `done`
// runs on the copier's completion thread, or on the pool's thread that saw
// the copy end (LandingLookUs).
void LandStaged(ThreadPool* pool, gpu::Copier& copier, void* dst, const char* buf, size_t n,
                int device, bool written_back, LandHold hold,
                std::shared_ptr<gpu::ReadyEvent> ready, std::function<void(const Status&)> done);

}  // namespace ferry
