#include "transfer/tcp/staging.h"

#include <atomic>

#include "common/cache.h"
#include "common/env.h"
#include "common/event_trace.h"
#include "common/held_work.h"
#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"

namespace ferry {
namespace {
std::atomic<size_t> bytes_held{0};
}  // namespace

Result<std::unique_ptr<StagingPool>> StagingPool::Create(size_t count, size_t bytes) {
  auto pool = std::unique_ptr<StagingPool>(new StagingPool(bytes));
  for (size_t i = 0; i < count; ++i) {
    FERRY_ASSIGN_OR_RETURN(void* p, gpu::AllocPinned(bytes));
    pool->all_.push_back(static_cast<char*>(p));
    bytes_held += bytes;
  }
  pool->free_ = pool->all_;
  return pool;
}

StagingPool::~StagingPool() {
  for (char* p : all_) gpu::FreePinned(p);
  bytes_held -= all_.size() * bytes_;
}

size_t StagingPool::BytesHeld() { return bytes_held.load(); }

void StagingPool::Take(std::function<void(char*)> fn) {
  char* buf;
  {
    std::lock_guard lk(mu_);
    if (free_.empty()) {
      waiting_.push_back(std::move(fn));
      return;
    }
    buf = free_.back();
    free_.pop_back();
  }
  fn(buf);
}

char* StagingPool::TryTake() {
  std::lock_guard lk(mu_);
  if (free_.empty()) return nullptr;
  char* buf = free_.back();
  free_.pop_back();
  return buf;
}

void StagingPool::Give(char* buf) {
  std::function<void(char*)> next;
  {
    std::lock_guard lk(mu_);
    if (waiting_.empty()) {
      free_.push_back(buf);
      return;
    }
    next = std::move(waiting_.front());
    waiting_.pop_front();
  }
  next(buf);
}

int EarlyRelease() {
  // Off: on the H200 (2026-12-05) giving back on send lost 14-15% for GPU
  // writes; with the lane's next send issued before the release, +4% on an
  // H100, inside its noise. On landing moved nothing (gpu-check probes-release).
  static const int mask = static_cast<int>(
      env::GetIntIn("FERRY_TCP_EARLY_RELEASE", 0, kReleaseOnSend | kReleaseOnLanding, 0));
  return mask;
}

bool ReadsLandInline() {
  // On two H100 leases (2026-12-06), 1 MiB x 128 reads into GPU memory:
  // 20.21 -> 21.56 and 22.23 -> 24.62 GB/s inline, 6 rounds of 6 ahead. The
  // hand-off to a landing thread (117 us median, traced) cost more than the
  // write-back and the copy's enqueue cost the socket thread.
  static const bool inline_ = env::GetIntIn("FERRY_READ_LANDING", 0, 1, 1) == 1;
  return inline_;
}

uint64_t ReadPieceBytes() {
  return static_cast<uint64_t>(env::GetIntIn("FERRY_READ_PIECE_KIB", 64, 65536, 0)) << 10;
}

int LandingLookUs() {
  // 0 by default: the copier's thread sees each landing's copy done. Traced
  // on an H100 (2026-12-06), that thread, sharing its core with an io
  // thread, saw a read's copy done 250 us after the GPU had finished it.
  static const int us = static_cast<int>(env::GetIntIn("FERRY_LANDING_LOOK_US", 0, 10000, 0));
  return us;
}

uint64_t WriteBackTailBytes() {
  static const uint64_t bytes =
      static_cast<uint64_t>(env::GetIntIn("FERRY_WRITEBACK_TAIL_KIB", 0, 65536, 0)) << 10;
  return bytes;
}

bool WriteBackEager() {
  static const bool eager = env::GetIntIn("FERRY_WRITEBACK_EAGER", 0, 1, 0) == 1;
  return eager;
}

void LandStaged(ThreadPool* pool, gpu::Copier& copier, void* dst, const char* buf, size_t n,
                int device, bool written_back, LandHold hold,
                std::shared_ptr<gpu::ReadyEvent> ready, std::function<void(const Status&)> done) {
  if (pool == nullptr && hold.depth > 0 && !written_back) {
    held::Hold(static_cast<size_t>(hold.depth),
               [&copier, dst, buf, n, device, early_wb = hold.early_writes_back,
                ready = std::move(ready), done = std::move(done)](bool early) mutable {
                 // Landed early, its lines may still be in this core's caches.
                 LandStaged(nullptr, copier, dst, buf, n, device, !(early && early_wb), LandHold{},
                            std::move(ready), std::move(done));
               });
    return;
  }
  // What is left to write back: nothing, the tail or all.
  const uint64_t tail = WriteBackTailBytes();
  const size_t wb = written_back ? 0 : tail > 0 && tail < n ? tail : n;
  // A landing thread may look for its copy's end itself; a socket thread
  // never waits on the GPU.
  const bool here = pool == nullptr;
  const int look_us = here ? 0 : LandingLookUs();
  auto land = [&copier, dst, buf, n, wb, here, device, look_us, ready = std::move(ready),
               done = std::move(done)]() mutable {
    const auto key = reinterpret_cast<uint64_t>(dst);
    FERRY_TRACE(trace::kLandStart, key);
    // Inline, this is the thread that received it.
    if (here) {
      WriteBackOwnForDma(buf + n - wb, wb);
    } else {
      WriteBackForDma(buf + n - wb, wb);
    }
    FERRY_TRACE(trace::kLandWrittenBack, key);
    if (trace::On()) {
      done = [done = std::move(done), key](const Status& st) {
        trace::Mark(trace::kLandCopyDone, key);
        done(st);
      };
    }
    copier.CopyAndLook(dst, buf, n, device, std::move(ready), look_us, std::move(done));
  };
  if (pool == nullptr) return land();
  pool->Post(std::move(land));
}

LandHold LandHoldFromEnv() {
  // Depth 1: on an H100 (2026-12-07), 1 MiB x 128, reads into GPU memory
  // here 29.67 -> 34.78 GB/s, writes into it at the target 25.05 -> 31.87,
  // 3 rounds of 3 ahead each; 2 moved reads no further (34.82).
  return {static_cast<int>(env::GetIntIn("FERRY_LAND_DEFER", 0, 4, 1)),
          env::GetIntIn("FERRY_LAND_EARLY_WRITEBACK", 0, 1, 1) == 1};
}

}  // namespace ferry
