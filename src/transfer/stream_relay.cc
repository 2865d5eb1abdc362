#include "transfer/stream_relay.h"

#include <algorithm>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/cache.h"
#include "common/log.h"
#include "common/poll_pacer.h"
#include "common/thread_name.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/transport.h"

namespace ferry {

namespace {

// Flags sit on their own cache lines: the GPU writes one, the CPU the other.
constexpr size_t kFlagStride = 64 / sizeof(uint32_t);

uint32_t LoadFlag(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void StoreFlag(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
// Cyclic, as cuStreamWaitValue32's GEQ: sequence numbers may wrap.
bool Reached(uint32_t now, uint32_t want) { return static_cast<int32_t>(now - want) >= 0; }

struct Slot {
  char* buf = nullptr;
  uint32_t* gpu_flag = nullptr;  // written by the stream
  uint32_t* cpu_flag = nullptr;  // written by engine threads, waited on by the stream
  uint32_t seq = 0;              // last value issued; by the slot's holder only
};

struct Window {
  uint32_t seq = 0;
  std::vector<size_t> chunks;
};

struct Job {
  Slot* slot = nullptr;
  std::vector<StreamRelay::Chunk> chunks;
  std::vector<uint64_t> staging;  // each staged chunk's offset in the slot
  std::vector<Window> windows;
  uint32_t final_seq = 0;
  std::shared_ptr<BatchState> state;
  std::mutex mu;
  // Tasks of the window with the transports (none: not posted yet, as every
  // window has a chunk); guarded by mu.
  size_t outstanding = 0;
  size_t next = 0;                    // the window waiting for the stream; guarded by mu
  std::map<uint32_t, Status> status;  // per request; guarded by mu
};

}  // namespace

class StreamRelay::Core : public std::enable_shared_from_this<StreamRelay::Core> {
 public:
  Core(gpu::Copier* copier, size_t slot_bytes, Millis timeout)
      : copier_(copier), slot_bytes_(slot_bytes), timeout_(timeout) {}

  ~Core() {
    for (Slot& s : slots_) {
      if (s.buf != nullptr) gpu::FreePinned(s.buf);
    }
    if (flags_ != nullptr) gpu::FreePinned(flags_);
  }

  Status Init(size_t count) {
    auto flags = gpu::AllocPinned(count * 2 * kFlagStride * sizeof(uint32_t));
    if (!flags.ok()) return flags.status();
    flags_ = static_cast<uint32_t*>(flags.value());
    std::fill_n(flags_, count * 2 * kFlagStride, 0u);
    slots_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      auto buf = gpu::AllocPinned(slot_bytes_);
      if (!buf.ok()) return buf.status();
      slots_[i].buf = static_cast<char*>(buf.value());
      slots_[i].gpu_flag = flags_ + (2 * i) * kFlagStride;
      slots_[i].cpu_flag = flags_ + (2 * i + 1) * kFlagStride;
      free_.push_back(&slots_[i]);
    }
    watcher_ = std::thread([this] {
      NameThisThread("ferry-relay");
      PollPacer::TightenTimerSlack();
      Watch();
    });
    return Status::Ok();
  }

  size_t slot_bytes() const { return slot_bytes_; }

  Status Submit(void* stream, std::vector<Chunk> chunks, std::shared_ptr<BatchState> state,
                Deadline deadline) {
    auto job = std::make_shared<Job>();
    job->chunks = std::move(chunks);
    job->state = std::move(state);
    Plan(*job);
    Slot* slot = Acquire(deadline);
    if (slot == nullptr) {
      return Status::Unavailable(
          "every stream-ordered staging slot stayed busy until the deadline");
    }
    job->slot = slot;
    const uint32_t first = slot->seq + 1;
    Status st = Enqueue(stream, *job);
    if (!st.ok()) {
      if (slot->seq + 1 == first) {
        Release(slot);  // nothing reached the stream
      } else {
        // Let every wait already on the stream pass. The slot's flags may
        // still be written by that stream, so the slot is retired.
        StoreFlag(slot->cpu_flag, slot->seq);
        FERRY_LOG_ERROR("stream relay: retiring a staging slot after a failed enqueue: {}",
                        st.ToString());
      }
      return st;
    }
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    return Status::Ok();
  }

  void Stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (watcher_.joinable()) watcher_.join();
    // Streams still inside a batch: release their waits, give them a moment
    // to pass, and fail what is left. Freeing the engine first is a misuse.
    Deadline grace = Deadline::After(std::chrono::seconds(1));
    for (auto& job : jobs_) {
      StoreFlag(job->slot->cpu_flag, job->final_seq);
      while (!Reached(LoadFlag(job->slot->gpu_flag), job->final_seq) && !grace.Expired()) {
        std::this_thread::sleep_for(Millis(1));
      }
      Finish(*job, Status::Cancelled("engine destroyed during the transfer"));
    }
    jobs_.clear();
  }

 private:
  // Splits the chunks into windows whose staged bytes fit in one slot.
  void Plan(Job& job) {
    job.staging.assign(job.chunks.size(), 0);
    uint64_t used = 0;
    for (size_t i = 0; i < job.chunks.size(); ++i) {
      const Chunk& c = job.chunks[i];
      if (job.windows.empty() || (c.staged && used + c.length > slot_bytes_)) {
        job.windows.emplace_back();
        used = 0;
      }
      if (c.staged) {
        job.staging[i] = used;
        used += c.length;
      }
      job.windows.back().chunks.push_back(i);
    }
  }

  Status Enqueue(void* stream, Job& job) {
    Slot& slot = *job.slot;
    for (Window& w : job.windows) {
      for (size_t i : w.chunks) {
        const Chunk& c = job.chunks[i];
        if (c.staged && c.op == Op::kWrite) {
          FERRY_RETURN_IF_ERROR(
              copier_->EnqueueOnStream(stream, slot.buf + job.staging[i], c.local, c.length));
        }
      }
      w.seq = slot.seq + 1;
      FERRY_RETURN_IF_ERROR(copier_->SignalOnStream(stream, slot.gpu_flag, w.seq));
      slot.seq = w.seq;
      FERRY_RETURN_IF_ERROR(copier_->WaitOnStream(stream, slot.cpu_flag, w.seq));
      for (size_t i : w.chunks) {
        const Chunk& c = job.chunks[i];
        if (c.staged && c.op == Op::kRead) {
          FERRY_RETURN_IF_ERROR(
              copier_->EnqueueOnStream(stream, c.local, slot.buf + job.staging[i], c.length));
        }
      }
    }
    job.final_seq = slot.seq + 1;
    FERRY_RETURN_IF_ERROR(copier_->SignalOnStream(stream, slot.gpu_flag, job.final_seq));
    slot.seq = job.final_seq;
    return Status::Ok();
  }

  Slot* Acquire(Deadline deadline) {
    std::unique_lock lk(mu_);
    while (free_.empty()) {
      if (stopping_ || slot_cv_.wait_until(lk, deadline.at()) == std::cv_status::timeout) {
        if (free_.empty()) return nullptr;
      }
    }
    Slot* s = free_.back();
    free_.pop_back();
    return s;
  }

  void Release(Slot* slot) {
    {
      std::lock_guard lk(mu_);
      free_.push_back(slot);
    }
    slot_cv_.notify_one();
  }

  // Hands window `w` to the transports. The chunks' deadlines start now: the
  // stream may have waited long behind the caller's own work.
  void Post(const std::shared_ptr<Job>& job, size_t w) {
    const Window& win = job->windows[w];
    Deadline deadline = Deadline::After(timeout_);
    job->state->NoteDeadline(deadline);
    std::unordered_map<Endpoint*, std::vector<Task>> posts;
    std::vector<Endpoint*> order;
    auto self = shared_from_this();
    for (size_t i : win.chunks) {
      const Chunk& c = job->chunks[i];
      Task t;
      t.op = c.op;
      t.local = c.staged ? job->slot->buf + job->staging[i] : c.local;
      t.remote = c.remote;
      t.length = c.length;
      t.index = c.index;
      t.gpu_remote = c.gpu_remote;
      t.deadline = deadline;
      t.batch = job->state;
      // A read staged here is read next by the stream's copy (see common/cache.h).
      const bool dma_next = c.staged && c.op == Op::kRead;
      t.on_done = std::make_shared<std::function<void(const Status&)>>(
          [self, job, index = c.index, dma_next, buf = t.local, n = t.length](const Status& s) {
            if (dma_next && s.ok()) WriteBackForDma(buf, n);
            self->ChunkDone(job, index, s);
          });
      auto& v = posts[c.endpoint.get()];
      if (v.empty()) order.push_back(c.endpoint.get());
      v.push_back(std::move(t));
    }
    for (Endpoint* ep : order) ep->Post(std::move(posts[ep]));
  }

  void ChunkDone(const std::shared_ptr<Job>& job, uint32_t index, const Status& s) {
    uint32_t seq;
    {
      std::lock_guard lk(job->mu);
      Status& st = job->status[index];
      if (st.ok() && !s.ok()) st = s;
      if (--job->outstanding != 0) return;
      seq = job->windows[job->next].seq;
      ++job->next;
    }
    // The window is done, failed or not: release the stream so it never hangs.
    // A failed read's staging-to-device copy still runs; its request reports
    // the error and its destination is undefined.
    StoreFlag(job->slot->cpu_flag, seq);
    cv_.notify_one();
  }

  void Finish(Job& job, const Status& override_status) {
    std::map<uint32_t, Status> status;
    {
      std::lock_guard lk(job.mu);
      status = job.status;
    }
    for (const Chunk& c : job.chunks) status.try_emplace(c.index);
    for (auto& [index, st] : status) {
      job.state->TaskDone(index, override_status.ok() ? st : override_status);
    }
  }

  // The watcher: reads the stream-written flags, never calls CUDA.
  void Watch() {
    std::vector<std::shared_ptr<Job>> mine;
    PollPacer pacer;
    for (;;) {
      {
        std::unique_lock lk(mu_);
        if (mine.empty()) cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) {
          // Stop() finishes what is left.
          for (auto& j : mine) jobs_.push_front(std::move(j));
          return;
        }
        for (auto& j : jobs_) mine.push_back(std::move(j));
        jobs_.clear();
      }
      bool progressed = false;
      for (auto it = mine.begin(); it != mine.end();) {
        Job& job = **it;
        const uint32_t gpu = LoadFlag(job.slot->gpu_flag);
        size_t post = job.windows.size();
        bool finished = false;
        {
          std::lock_guard lk(job.mu);
          if (job.next < job.windows.size()) {
            if (job.outstanding == 0 && Reached(gpu, job.windows[job.next].seq)) {
              post = job.next;
              job.outstanding = job.windows[post].chunks.size();
            }
          } else {
            finished = Reached(gpu, job.final_seq);
          }
        }
        if (post < job.windows.size()) {
          Post(*it, post);
          progressed = true;
        }
        if (finished) {
          Finish(job, Status::Ok());
          Release(job.slot);
          it = mine.erase(it);
          progressed = true;
          continue;
        }
        ++it;
      }
      pacer.AfterLook(progressed, !mine.empty(), [this](auto d) {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, d);  // a finished window cuts it short
      });
    }
  }

  gpu::Copier* const copier_;
  const size_t slot_bytes_;
  const Millis timeout_;
  uint32_t* flags_ = nullptr;
  std::vector<Slot> slots_;
  std::thread watcher_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable slot_cv_;
  std::vector<Slot*> free_;               // guarded by mu_
  std::list<std::shared_ptr<Job>> jobs_;  // submitted, not yet the watcher's; guarded by mu_
  bool stopping_ = false;                 // guarded by mu_
};

Result<std::unique_ptr<StreamRelay>> StreamRelay::Create(gpu::Copier* copier, size_t slots,
                                                         size_t slot_bytes,
                                                         Millis request_timeout) {
  auto core = std::make_shared<Core>(copier, slot_bytes, request_timeout);
  FERRY_RETURN_IF_ERROR(core->Init(slots));
  return std::unique_ptr<StreamRelay>(new StreamRelay(std::move(core)));
}

StreamRelay::~StreamRelay() { core_->Stop(); }

size_t StreamRelay::slot_bytes() const { return core_->slot_bytes(); }

Status StreamRelay::Submit(void* stream, std::vector<Chunk> chunks,
                           std::shared_ptr<BatchState> state, Deadline deadline) {
  return core_->Submit(stream, std::move(chunks), std::move(state), deadline);
}

}  // namespace ferry
