#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/cpu_claim.h"
#include "common/env.h"
#include "common/log.h"
#include "common/poll_pacer.h"
#include "common/thread_name.h"
#include "gpu/copier.h"
#include "gpu/copy_trace.h"
#include "gpu/cuda_util.h"
#include "gpu/gpu.h"

namespace ferry::gpu {

namespace {

Status CudaError(cudaError_t err, const char* what) {
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

// Per-device pools, filled at creation so the data path never creates streams.
struct DevicePool {
  std::vector<cudaStream_t> streams;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<cudaEvent_t> free_events;  // guarded by mu
  GpuClock clock;                        // traced runs only
};

// FERRY_COPY_STREAMS (1-64, default 4): the private streams of each device.
int StreamsPerDevice() {
  static const int n = static_cast<int>(env::GetIntIn("FERRY_COPY_STREAMS", 1, 64, 4));
  return n;
}
constexpr int kEventsPerDevice = 256;

// The device of a caller's stream. The default and per-thread handles belong
// to the thread's current device; they are not named, only looked up.
cudaError_t StreamDevice(cudaStream_t s, int* device) {
  if (cudaStreamGetDevice(s, device) == cudaSuccess) return cudaSuccess;
  cudaGetLastError();  // not sticky; clear it before the fallback
  return cudaGetDevice(device);
}

}  // namespace

class ReadyEvent {
 public:
  ReadyEvent(cudaEvent_t e, int device, DevicePool* pool) : event(e), device(device), pool_(pool) {}
  ~ReadyEvent() {
    std::lock_guard lk(pool_->mu);
    pool_->free_events.push_back(event);
  }
  const cudaEvent_t event;
  const int device;

 private:
  DevicePool* pool_;
};

namespace {

class CudaCopier : public Copier {
 public:
  Status Init() {
    int n = DeviceCount();
    if (n == 0) return Status::NotSupported(Describe());
    // Stream memory operations, from the driver at run time: libcuda is never linked.
    wait_value_ = DriverFunction<WaitValueFn>("cuStreamWaitValue32");
    write_value_ = DriverFunction<WriteValueFn>("cuStreamWriteValue32");
    pools_.reserve(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) {
      auto pool = std::make_unique<DevicePool>();
      DeviceGuard guard(d);
      cudaError_t err = cudaSuccess;
      for (int i = 0; err == cudaSuccess && i < StreamsPerDevice(); ++i) {
        cudaStream_t s;
        err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (err == cudaSuccess) pool->streams.push_back(s);
      }
      for (int i = 0; err == cudaSuccess && i < kEventsPerDevice; ++i) {
        cudaEvent_t e;
        err = cudaEventCreateWithFlags(&e, event_flags_);
        if (err == cudaSuccess) pool->free_events.push_back(e);
      }
      if (err == cudaSuccess && trace::On()) err = pool->clock.Start(pool->streams[0]);
      pools_.push_back(std::move(pool));
      if (err != cudaSuccess) return CudaError(err, "creating the GPU stream and event pools");
    }
    // Copies between GPUs (cuda_ipc to a peer's other GPU) go device to device.
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) EnablePeerAccess(a, b);
    }
    if (cudaError_t err = MakeFlags(); err != cudaSuccess) {
      return CudaError(err, "allocating the copier's completion words");
    }
    poller_ = std::thread([this] {
      NameThisThread("ferry-copier");
      PollPacer::TightenTimerSlack();
      Poll();
    });
    return Status::Ok();
  }

  ~CudaCopier() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (poller_.joinable()) poller_.join();
    for (size_t d = 0; d < pools_.size(); ++d) {
      DeviceGuard guard(static_cast<int>(d));
      for (auto s : pools_[d]->streams) cudaStreamDestroy(s);
      for (auto e : pools_[d]->free_events) cudaEventDestroy(e);
      pools_[d]->clock.Release();
    }
    if (flags_ != nullptr) cudaFreeHost(flags_);
  }

  Result<std::shared_ptr<ReadyEvent>> RecordReady(void* stream) override {
    auto s = static_cast<cudaStream_t>(stream);
    int device = 0;
    cudaError_t err = StreamDevice(s, &device);
    if (err != cudaSuccess) return CudaError(err, "finding the submission stream's device");
    FERRY_ASSIGN_OR_RETURN(cudaEvent_t e, TakeEvent(device));
    auto ready = std::make_shared<ReadyEvent>(e, device, pools_[static_cast<size_t>(device)].get());
    err = cudaEventRecord(e, s);
    if (err != cudaSuccess) return CudaError(err, "recording readiness on the submission stream");
    return ready;
  }

  void CopyAsync(void* dst, const void* src, size_t length, int device,
                 std::shared_ptr<ReadyEvent> ready,
                 std::function<void(const Status&)> done) override {
    CopyAndLook(dst, src, length, device, std::move(ready), 0, std::move(done));
  }

  void CopyAndLook(void* dst, const void* src, size_t length, int device,
                   std::shared_ptr<ReadyEvent> ready, int look_us,
                   std::function<void(const Status&)> done) override {
    if (device < 0 || static_cast<size_t>(device) >= pools_.size()) {
      return done(Status::InvalidArgument("no such GPU"));
    }
    DevicePool& pool = *pools_[static_cast<size_t>(device)];
    // May run on a caller's thread (copies that cannot block): leave its device be.
    DeviceGuard guard(device);
    cudaStream_t s = pool.streams[pool.next.fetch_add(1) % pool.streams.size()];
    cudaError_t err = cudaSuccess;
    if (ready) err = cudaStreamWaitEvent(s, ready->event, 0);
    cudaEvent_t start = nullptr;
    if (err == cudaSuccess && trace::On()) start = StartTimed(dst, device, s);
    if (err == cudaSuccess)
      err = TimedCopy(trace::kCopyEnqueued, dst, src, length, cudaMemcpyDefault, s);
    if (err != cudaSuccess) {
      if (start != nullptr) GiveEvent(device, start);
      return done(CudaError(err, "enqueueing a GPU copy"));
    }
    const auto key = reinterpret_cast<uint64_t>(dst);
    if (look_us <= 0) return Track(s, device, std::move(ready), std::move(done), true, start, key);
    const cudaEvent_t end = RecordEnd(s, device, start, done);
    if (end == nullptr) return;
    Pending p{end, s, device, std::move(ready), std::move(done), start, key};
    // Spins, no yield: a yield hands the core to whichever thread shares it.
    const auto until = Clock::now() + std::chrono::microseconds(look_us);
    do {
      err = cudaEventQuery(p.event);
      if (err != cudaErrorNotReady) return Finish(p, err);
    } while (Clock::now() < until);
    {
      std::lock_guard lk(mu_);
      pending_.push_back(std::move(p));
    }
    cv_.notify_one();
  }

  void CopyManyAsync(std::vector<Copy> copies, int device,
                     std::shared_ptr<ReadyEvent> ready) override {
    if (device < 0 || static_cast<size_t>(device) >= pools_.size()) {
      for (Copy& c : copies) c.done(Status::InvalidArgument("no such GPU"));
      return;
    }
    DevicePool& pool = *pools_[static_cast<size_t>(device)];
    DeviceGuard guard(device);
    size_t bytes = 0;
    for (const Copy& c : copies) bytes += c.length;
    const size_t n = bytes >= spread_bytes_ ? std::min(pool.streams.size(), copies.size()) : 1;
    const size_t first = pool.next.fetch_add(n);
    // Stream k takes copies k, k+n, k+2n, ...: a large batch's copies overlap.
    std::vector<std::vector<size_t>> share(n);
    for (size_t i = 0; i < copies.size(); ++i) share[i % n].push_back(i);
    for (size_t k = 0; k < n; ++k) {
      if (share[k].empty()) continue;
      cudaStream_t s = pool.streams[(first + k) % pool.streams.size()];
      cudaError_t err = ready ? cudaStreamWaitEvent(s, ready->event, 0) : cudaSuccess;
      std::vector<std::function<void(const Status&)>> dones;
      if (err == cudaSuccess && batch_copies_ && share[k].size() > 1) {
        err = EnqueueBatch(copies, share[k], s);
        if (err == cudaSuccess) {
          for (size_t i : share[k]) dones.push_back(std::move(copies[i].done));
        }
      } else if (err == cudaSuccess) {
        for (size_t i : share[k]) {
          const Copy& c = copies[i];
          cudaError_t e = cudaMemcpyAsync(c.dst, c.src, c.length, cudaMemcpyDefault, s);
          if (e != cudaSuccess) {
            copies[i].done(CudaError(e, "enqueueing a GPU copy"));
          } else {
            dones.push_back(std::move(copies[i].done));
          }
        }
      }
      if (err != cudaSuccess) {
        for (size_t i : share[k]) copies[i].done(CudaError(err, "enqueueing GPU copies"));
        continue;
      }
      if (dones.empty()) continue;
      Track(
          s, device, ready,
          [each = std::move(dones)](const Status& st) {
            for (const auto& done : each) done(st);
          },
          true);
    }
  }

  class CudaRun : public Run {
   public:
    CudaRun(CudaCopier& c, int device, std::shared_ptr<ReadyEvent> ready)
        : c_(c), device_(device), ready_(std::move(ready)) {
      if (device < 0 || static_cast<size_t>(device) >= c.pools_.size()) {
        error_ = Status::InvalidArgument("no such GPU");
        return;
      }
      DevicePool& pool = *c.pools_[static_cast<size_t>(device)];
      s_ = pool.streams[pool.next.fetch_add(1) % pool.streams.size()];
      DeviceGuard guard(device);
      if (ready_) {
        cudaError_t err = cudaStreamWaitEvent(s_, ready_->event, 0);
        if (err != cudaSuccess) error_ = CudaError(err, "waiting on readiness");
      }
    }
    Status Add(void* dst, const void* src, size_t length) override {
      if (!error_.ok()) return error_;
      DeviceGuard guard(device_);
      cudaError_t err = TimedCopy(trace::kCopyEnqueued, dst, src, length, cudaMemcpyDefault, s_);
      if (err != cudaSuccess) error_ = CudaError(err, "enqueueing a GPU copy");
      return error_;
    }
    void End(std::function<void(const Status&)> done) override {
      if (!error_.ok()) return done(error_);
      DeviceGuard guard(device_);
      c_.Track(s_, device_, std::move(ready_), std::move(done), true);
    }

   private:
    CudaCopier& c_;
    const int device_;
    std::shared_ptr<ReadyEvent> ready_;
    cudaStream_t s_ = nullptr;
    Status error_;
  };

  std::unique_ptr<Run> StartRun(int device, std::shared_ptr<ReadyEvent> ready) override {
    return std::make_unique<CudaRun>(*this, device, std::move(ready));
  }

  Status CheckStream(void* stream) override {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
    if (err != cudaSuccess) return CudaError(err, "checking the submission stream");
    if (capture != cudaStreamCaptureStatusNone) {
      return Status::NotSupported(
          "stream-ordered transfers cannot be captured into a CUDA graph yet");
    }
    return Status::Ok();
  }

  Status EnqueueOnStream(void* stream, void* dst, const void* src, size_t length) override {
    cudaError_t err =
        cudaMemcpyAsync(dst, src, length, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "enqueueing on the caller's stream");
  }

  void NotifyOnStream(void* stream, std::function<void(const Status&)> done) override {
    auto s = static_cast<cudaStream_t>(stream);
    int device = 0;
    cudaError_t err = StreamDevice(s, &device);
    if (err != cudaSuccess) return done(CudaError(err, "finding the stream's device"));
    Track(s, device, nullptr, std::move(done));
  }

  Status SignalOnStream(void* stream, uint32_t* flag, uint32_t value) override {
    if (write_value_ == nullptr) return NoMemOps();
    CUresult r = write_value_(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag),
                              value, CU_STREAM_WRITE_VALUE_DEFAULT);
    return DriverStatus(r, "cuStreamWriteValue32 on the caller's stream");
  }

  Status WaitOnStream(void* stream, const uint32_t* flag, uint32_t value) override {
    if (wait_value_ == nullptr) return NoMemOps();
    CUresult r = wait_value_(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag),
                             value, CU_STREAM_WAIT_VALUE_GEQ);
    return DriverStatus(r, "cuStreamWaitValue32 on the caller's stream");
  }

  Status ConfineThread(const std::vector<int>& cpus) override {
    return cpus::ConfineThread(poller_.native_handle(), cpus);
  }

 private:
  using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  using WriteValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

  static Status NoMemOps() {
    return Status::NotSupported("the driver has no stream memory operations");
  }

  static Status DriverStatus(CUresult r, const char* what) {
    if (r == CUDA_SUCCESS) return Status::Ok();
    return Status::Internal(std::string(what) + " failed: CUresult " + std::to_string(r));
  }

  // The copies `which` of `copies` on `s` in one cudaMemcpyBatchAsync: one
  // call where a cudaMemcpyAsync each costs the submitting thread a few
  // microseconds, which is what bounds a batch of small device copies. A
  // driver that refuses the call turns batching off for the process, and the
  // copies go one at a time. Should it have enqueued some before refusing,
  // those run twice, the same bytes to the same place before any is
  // reported done.
  cudaError_t EnqueueBatch(const std::vector<Copy>& copies, const std::vector<size_t>& which,
                           cudaStream_t s) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (size_t i : which) {
      dsts.push_back(copies[i].dst);
      srcs.push_back(copies[i].src);
      sizes.push_back(copies[i].length);
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_from = 0;
    cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), which.size(),
                                           &attr, &attr_from, 1, s);
    if (err == cudaSuccess) return err;
    cudaGetLastError();
    if (batch_copies_.exchange(false)) {
      FERRY_LOG_WARN("GPU copies go one at a time: cudaMemcpyBatchAsync: {}",
                     cudaGetErrorString(err));
    }
    for (size_t i : which) {
      const Copy& c = copies[i];
      err = cudaMemcpyAsync(c.dst, c.src, c.length, cudaMemcpyDefault, s);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }

  struct Pending {
    cudaEvent_t event;
    cudaStream_t stream;
    int device;
    std::shared_ptr<ReadyEvent> ready;  // kept until the copy that waits on it is done
    std::function<void(const Status&)> done;
    cudaEvent_t start;  // traced copies into GPU memory: recorded just before the copy
    uint64_t key;
    int slot = -1;  // FERRY_COPY_FLAGS: the word the stream writes `value` to once done
    uint32_t value = 0;
  };

  // Records a completion event on `s` and hands it to the completion thread,
  // which runs `done` once the work enqueued so far has finished.
  // `own`: `s` is one of the copier's streams, whose device is current.
  void Track(cudaStream_t s, int device, std::shared_ptr<ReadyEvent> ready,
             std::function<void(const Status&)> done, bool own = false, cudaEvent_t start = nullptr,
             uint64_t key = 0) {
    const cudaEvent_t end = RecordEnd(s, device, start, done);
    if (end == nullptr) return;
    Pending p{end, s, device, std::move(ready), std::move(done), start, key};
    int slot = -1;
    uint32_t value = 0;
    {
      std::lock_guard lk(mu_);
      if (own && flags_ != nullptr && !free_slots_.empty()) {
        p.slot = slot = free_slots_.back();
        free_slots_.pop_back();
        p.value = value = ++flag_value_;
      }
      pending_.push_back(std::move(p));
    }
    // The flag goes after the event: a flag seen means the event is done
    // too. Should the write not be enqueued, the next sweep sees the event.
    if (slot >= 0) {
      write_value_(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(&flags_[slot]), value,
                   CU_STREAM_WRITE_VALUE_DEFAULT);
    }
    cv_.notify_one();
  }

  // FERRY_COPY_FLAGS=1: each tracked copy's stream also writes a page-locked
  // word when it is done, so the completion thread sees most completions by
  // reading memory, not by a CUDA call that takes the driver's locks beside
  // the threads enqueueing copies. Errors still come from the event.
  cudaError_t MakeFlags() {
    if (env::GetIntIn("FERRY_COPY_FLAGS", 0, 1, 0) == 0 || write_value_ == nullptr) {
      return cudaSuccess;
    }
    cudaError_t err = cudaMallocHost(reinterpret_cast<void**>(&flags_), kFlags * sizeof(uint32_t));
    if (err != cudaSuccess) return err;
    for (int i = 0; i < kFlags; ++i) {
      flags_[i] = 0;
      free_slots_.push_back(i);
    }
    return cudaSuccess;
  }

  // Whether a pending copy may be done: its flag is written, or it has none,
  // or its flag has not moved for a while (a failed copy never writes it).
  bool MayBeDone(const Pending& p, bool sweep) const {
    if (p.slot < 0 || sweep) return true;
    return __atomic_load_n(&flags_[p.slot], __ATOMIC_ACQUIRE) == p.value;
  }

  // A completion event recorded on `s`; or null, with `start` given back
  // and `done` run with the error.
  cudaEvent_t RecordEnd(cudaStream_t s, int device, cudaEvent_t start,
                        const std::function<void(const Status&)>& done) {
    auto e = TakeEvent(device);
    cudaError_t err = e.ok() ? cudaEventRecord(e.value(), s) : cudaSuccess;
    if (e.ok() && err == cudaSuccess) return e.value();
    if (e.ok()) GiveEvent(device, e.value());
    if (start != nullptr) GiveEvent(device, start);
    done(e.ok() ? CudaError(err, "recording completion") : e.status());
    return nullptr;
  }

  // A tracked copy whose event has answered `err`: its events go back to
  // the pool, then its `done` runs.
  void Finish(Pending& p, cudaError_t err) {
    Status st = err == cudaSuccess ? Status::Ok() : CudaError(err, "GPU copy");
    if (p.start != nullptr) {
      if (err == cudaSuccess) {
        pools_[static_cast<size_t>(p.device)]->clock.MarkCopyIn(p.key, p.start, p.event);
      }
      GiveEvent(p.device, p.start);
    }
    GiveEvent(p.device, p.event);
    p.ready.reset();
    auto done = std::move(p.done);
    done(st);
  }

  // Traced runs: an event on `s` just before a copy into GPU memory, or null
  // for other copies (their destinations are not the trace's keys).
  cudaEvent_t StartTimed(void* dst, int device, cudaStream_t s) {
    if (Classify(dst).kind != MemoryKind::kDevice) return nullptr;
    auto e = TakeEvent(device);
    if (!e.ok()) return nullptr;
    if (cudaEventRecord(e.value(), s) != cudaSuccess) {
      GiveEvent(device, e.value());
      return nullptr;
    }
    return e.value();
  }

  Result<cudaEvent_t> TakeEvent(int device) {
    DevicePool& pool = *pools_[static_cast<size_t>(device)];
    {
      std::lock_guard lk(pool.mu);
      if (!pool.free_events.empty()) {
        cudaEvent_t e = pool.free_events.back();
        pool.free_events.pop_back();
        return e;
      }
    }
    // Pool exhausted under a burst: grow it. Event creation does not
    // synchronize the device.
    DeviceGuard guard(device);
    cudaEvent_t e;
    cudaError_t err = cudaEventCreateWithFlags(&e, event_flags_);
    if (err != cudaSuccess) return CudaError(err, "growing the event pool");
    return e;
  }

  void GiveEvent(int device, cudaEvent_t e) {
    DevicePool& pool = *pools_[static_cast<size_t>(device)];
    std::lock_guard lk(pool.mu);
    pool.free_events.push_back(e);
  }

  // The completion thread: queries events, never waits inside CUDA.
  void Poll() {
    std::deque<Pending> mine;
    std::vector<cudaStream_t> blocked;
    std::vector<int> freed;
    PollPacer pacer;
    LookTimer timer;
    auto last_sweep = Clock::now();
    for (;;) {
      {
        std::unique_lock lk(mu_);
        free_slots_.insert(free_slots_.end(), freed.begin(), freed.end());
        freed.clear();
        if (mine.empty() && pending_.empty() && !stopping_ && pacer.Hot()) {
          // Right after progress the next copy is likely close: looking
          // again beats a wake-up from the condition variable.
          lk.unlock();
          PollPacer::HotPause();
          continue;
        }
        if (mine.empty()) cv_.wait(lk, [&] { return stopping_ || !pending_.empty(); });
        while (!pending_.empty()) {
          mine.push_back(std::move(pending_.front()));
          pending_.pop_front();
        }
        if (stopping_ && mine.empty()) return;
      }
      // A stream completes in order: once one of its events is pending, the
      // later ones are not queried. Fewer queries, less contention for the
      // driver's locks with threads that are enqueueing copies.
      bool progressed = false;
      blocked.clear();
      timer.LookStarts();
      // Flags or not, every event is queried now and then: a failed copy
      // writes no flag.
      const bool sweep = flags_ != nullptr && Clock::now() - last_sweep > kSweep;
      if (sweep) last_sweep = Clock::now();
      for (auto it = mine.begin(); it != mine.end();) {
        if (std::find(blocked.begin(), blocked.end(), it->stream) != blocked.end() ||
            !MayBeDone(*it, sweep)) {
          if (it->slot >= 0) blocked.push_back(it->stream);
          ++it;
          continue;
        }
        timer.Query();
        cudaError_t err = cudaEventQuery(it->event);
        timer.Queried();
        if (err == cudaErrorNotReady) {
          blocked.push_back(it->stream);
          ++it;
          continue;
        }
        if (it->slot >= 0) freed.push_back(it->slot);
        Pending p = std::move(*it);
        it = mine.erase(it);
        timer.Call();
        Finish(p, err);
        timer.Called();
        progressed = true;
      }
      timer.LookEnds(!mine.empty());
      pacer.AfterLook(progressed, !mine.empty(), [](auto d) { std::this_thread::sleep_for(d); });
    }
  }

  // FERRY_COPY_FLAGS: words of page-locked memory, one per tracked copy at a time.
  static constexpr int kFlags = 4096;
  static constexpr auto kSweep = std::chrono::milliseconds(1);
  uint32_t* flags_ = nullptr;
  std::vector<int> free_slots_;  // guarded by mu_
  uint32_t flag_value_ = 0;      // guarded by mu_

  std::vector<std::unique_ptr<DevicePool>> pools_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;  // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  std::thread poller_;
  WaitValueFn wait_value_ = nullptr;
  WriteValueFn write_value_ = nullptr;
  // Timing costs an event a little; only traced runs use it.
  const unsigned event_flags_ = trace::On() ? cudaEventDefault : cudaEventDisableTiming;
  // FERRY_COPY_BATCH (default 1): a stream's share of a batch of copies is
  // enqueued in one call (EnqueueBatch); 0 enqueues each copy alone.
  std::atomic<bool> batch_copies_{env::GetIntIn("FERRY_COPY_BATCH", 0, 1, 1) == 1};
  // FERRY_COPY_SPREAD_MIB (default 32): CopyManyAsync spreads a batch of at
  // least this many MiB over the device's streams; smaller ones take one.
  const size_t spread_bytes_ =
      static_cast<size_t>(env::GetIntIn("FERRY_COPY_SPREAD_MIB", 1, 1 << 16, 32)) << 20;
};

}  // namespace

Result<std::unique_ptr<Copier>> Copier::Create() {
  auto c = std::make_unique<CudaCopier>();
  FERRY_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Copier>(std::move(c));
}

}  // namespace ferry::gpu
