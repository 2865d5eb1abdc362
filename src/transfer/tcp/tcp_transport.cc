// The tcp transport: reaches any peer whose listener it can connect to. Each
// request is sliced into chunks (tcp_chunk_bytes; tcp_gpu_chunk_bytes where
// GPU memory is at either end) spread over the peer's lanes
// (tcp_lanes), each lane keeping tcp_chunks_in_flight on the wire. Chunks that
// touch GPU memory at the target take lanes of their own where tcp_gpu_lanes
// is the smaller; those staged here are host bytes to the target and take
// the host lanes. A lane connects only once it has work.
// Both ends live here: the initiator's endpoint and lanes (lane.h), and the
// target side that serves their frames on the engine's listener (target.h).
#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>

#include "common/cpu_quota.h"
#include "common/env.h"
#include "common/event_trace.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "ferry/engine.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/io_pool.h"
#include "transfer/segment.h"
#include "transfer/tcp/lane.h"
#include "transfer/tcp/staging.h"
#include "transfer/tcp/target.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

// Lanes to one peer and the queues they take chunks from.
struct LaneGroup {
  std::vector<std::shared_ptr<Lane>> lanes;
  std::vector<std::shared_ptr<ChunkQueue>> queues;  // one shared, or one per lane
  std::atomic<size_t> next{0};

  // A shared queue wakes as many lanes as there are tasks, round-robin:
  // the lanes that wake take what their windows allow, and each lane takes
  // more as its replies come. Otherwise each lane has a queue of its own
  // and gets every n-th task, as before the shared queue.
  void Post(std::vector<Task> tasks) {
    const size_t n = lanes.size();
    const size_t start = next.fetch_add(tasks.size(), std::memory_order_relaxed);
    if (queues.size() == 1) {
      const size_t wake = std::min(tasks.size(), n);
      queues[0]->Push(std::move(tasks));
      for (size_t i = 0; i < wake; ++i) lanes[(start + i) % n]->Kick();
      return;
    }
    std::vector<std::vector<Task>> per(n);
    for (size_t i = 0; i < tasks.size(); ++i) per[(start + i) % n].push_back(std::move(tasks[i]));
    for (size_t i = 0; i < n; ++i) {
      if (per[i].empty()) continue;
      queues[i]->Push(std::move(per[i]));
      lanes[i]->Kick();
    }
  }

  void Close() {
    for (auto& q : queues) q->Close();
    for (auto& l : lanes) l->Close();
  }
};

// GPU memory over tcp goes through the staging ring: a write's chunk is copied
// device-to-host on a private stream after the readiness event, then sent; a
// read's chunk lands in staging, then is copied host-to-device after the
// readiness event (R2). With several chunks staged at once, the copy of chunk
// k+1 overlaps the send of chunk k. A GPU write completes when the target has
// acknowledged it; a GPU read once the bytes are in device memory (R3). GPU
// memory at the target is the target side's to stage (target.h): to this
// side it is plain bytes.
class TcpEndpoint : public Endpoint, public std::enable_shared_from_this<TcpEndpoint> {
 public:
  // `gpu` carries the chunks that touch GPU memory; it may be `host`.
  // Of `staging`'s buffers, `gpu_cap` is the most that chunks into GPU
  // memory at the target hold at once, `read_cap` the most that reads into
  // GPU memory here only do. `read_piece`: ReadPieceBytes, for reads that
  // land inline (a null `landing`); `land_hold`: LandHoldFromEnv.
  TcpEndpoint(std::shared_ptr<LaneGroup> host, std::shared_ptr<LaneGroup> gpu, gpu::Copier* copier,
              std::shared_ptr<StagingPool> staging, size_t gpu_cap, size_t read_cap,
              ThreadPool* landing, uint64_t read_piece, LandHold land_hold)
      : host_(std::move(host)),
        gpu_(std::move(gpu)),
        copier_(copier),
        staging_(std::move(staging)),
        gpu_there_{gpu_cap, 0, {}},
        reads_here_{read_cap, 0, {}},
        landing_(landing),
        read_piece_(landing == nullptr ? read_piece : 0),
        land_hold_(land_hold) {}
  ~TcpEndpoint() override { Close(); }

  void Post(std::vector<Task> tasks) override {
    // Host memory at both ends: the tasks go on as they came, not split.
    if (std::none_of(tasks.begin(), tasks.end(),
                     [](const Task& t) { return t.gpu_local || t.gpu_remote; })) {
      return host_->Post(std::move(tasks));
    }
    std::vector<Task> host, gpu;
    host.reserve(tasks.size());
    for (auto& t : tasks) {
      if (!t.gpu_local) {
        (t.gpu_remote ? gpu : host).push_back(std::move(t));
      } else if (copier_ == nullptr || staging_ == nullptr) {
        t.Done(Status::NotSupported("no pinned staging for GPU memory over tcp"));
      } else {
        Stage(std::move(t));
      }
    }
    if (!host.empty()) host_->Post(std::move(host));
    if (!gpu.empty()) gpu_->Post(std::move(gpu));
  }

  void Close() override {
    host_->Close();
    if (gpu_ != host_) gpu_->Close();
  }

 private:
  // How many of a kind of chunk may hold buffers at once, and those of that
  // kind waiting for a place.
  struct Cap {
    size_t limit;
    size_t held = 0;           // guarded by cap_mu_
    std::deque<Task> waiting;  // guarded by cap_mu_
  };

  // Chunks into GPU memory at the target, and reads into GPU memory here
  // only, each have a cap below the pool's size: more of them in flight lost
  // (see the pool's size in Connect). Writes to host memory there take any
  // buffer.
  Cap* CapFor(const Task& t) {
    if (t.gpu_remote) return &gpu_there_;
    return t.op == Op::kRead ? &reads_here_ : nullptr;
  }

  // A capped chunk waits here for a place before it takes a buffer.
  void Stage(Task t) {
    FERRY_TRACE(trace::kStageAsked, t.remote);
    if (Cap* cap = CapFor(t)) {
      std::lock_guard lk(cap_mu_);
      if (cap->held >= cap->limit) {
        cap->waiting.push_back(std::move(t));
        return;
      }
      ++cap->held;
    }
    TakeBuffer(std::move(t));
  }

  void TakeBuffer(Task t) {
    staging_->Take([self = shared_from_this(), t = std::move(t)](char* buf) mutable {
      self->Start(std::move(t), buf);
    });
  }

  // A chunk's buffer; its place under `cap` (CapFor the chunk), if it has
  // one, passes to the next chunk waiting, or is freed.
  void Release(char* buf, Cap* cap) {
    staging_->Give(buf);
    if (cap == nullptr) return;
    Task next;
    {
      std::lock_guard lk(cap_mu_);
      if (cap->waiting.empty()) {
        --cap->held;
        return;
      }
      next = std::move(cap->waiting.front());
      cap->waiting.pop_front();
    }
    TakeBuffer(std::move(next));
  }

  // Gives `buf` back the first time it runs: a staged write's buffer is
  // free once its bytes are sent or the write has failed, whichever is first.
  std::shared_ptr<std::function<void()>> ReleaseOnce(char* buf, Cap* cap) {
    auto held = std::make_shared<std::atomic<bool>>(true);
    return std::make_shared<std::function<void()>>([self = shared_from_this(), buf, cap, held] {
      if (held->exchange(false, std::memory_order_acq_rel)) self->Release(buf, cap);
    });
  }

  // A host task over `buf` that stands in for `t` on the wire.
  Task StandIn(const Task& t, char* buf, std::function<void(const Status&)> done) {
    Task h = t;
    h.local = buf;
    h.gpu_device = -1;
    h.gpu_local = false;
    h.ready = nullptr;
    h.on_done = std::make_shared<std::function<void(const Status&)>>(std::move(done));
    return h;
  }

  // A chunk staged here is plain host bytes to the target: where its memory
  // there is host memory too, it goes on all the host lanes. The GPU lanes
  // carry the chunks the target stages, as many as its landing threads and
  // staging are sized for. On an H100, 1 MiB x 128 with GPU memory here
  // only: writes 19.05 against 14.33 GB/s on the GPU lanes, reads 22.53
  // against 20.56 (medians of 3, every round ahead).
  LaneGroup& LanesFor(const Task& t) const { return t.gpu_remote ? *gpu_ : *host_; }

  void Start(Task t, char* buf) {
    auto self = shared_from_this();
    FERRY_TRACE(trace::kStaged, t.remote);
    if (t.op == Op::kWrite) {
      copier_->CopyAsync(buf, t.local, t.length, t.gpu_device, t.ready,
                         [self, t, buf](const Status& st) {
                           FERRY_TRACE(trace::kStagedCopyDone, t.remote);
                           if (!st.ok()) {
                             self->Release(buf, self->CapFor(t));
                             return t.Done(st);
                           }
                           auto release = self->ReleaseOnce(buf, self->CapFor(t));
                           Task h = self->StandIn(t, buf, [t, release](const Status& s) {
                             (*release)();
                             t.Done(s);
                           });
                           // Without it the buffer is held a round trip
                           // longer, to the ack.
                           if (EarlyRelease() & kReleaseOnSend) h.on_sent = release;
                           self->LanesFor(t).Post({std::move(h)});
                         });
      FERRY_TRACE(trace::kStagedEnqueued, t.remote);
      return;
    }
    if (read_piece_ > 0 && read_piece_ < t.length) return StartPieces(std::move(t), buf);
    // Written back as it comes in only where it lands on the socket thread
    // that received it.
    const bool eager = landing_ == nullptr && WriteBackEager();
    Task h = StandIn(t, buf, [self, t, buf, eager](const Status& s) {
      if (!s.ok()) {
        self->Release(buf, self->CapFor(t));
        return t.Done(s);
      }
      FERRY_TRACE(trace::kStagedReadIn, reinterpret_cast<uint64_t>(t.local));
      LandStaged(self->landing_, *self->copier_, t.local, buf, t.length, t.gpu_device, eager,
                 self->land_hold_, t.ready, [self, t, buf](const Status& s2) {
                   self->Release(buf, self->CapFor(t));
                   t.Done(s2);
                 });
    });
    h.write_back_in = eager;
    LanesFor(t).Post({std::move(h)});
  }

  // A read into GPU memory whose pieces land as they come in: each piece's
  // copy is enqueued on the socket thread while its lines are still in
  // cache, all on one stream (Copier::Run); no write-back, which cost the
  // hand-staged streams a fifth with pieces (2026-12-07). The buffer goes
  // back, and the read completes, once every copy has landed. The run
  // starts with the first piece, on the socket thread, as a whole landing
  // does: started here, its stream's wait on readiness was queued by
  // whichever thread handed this read its place, mostly the copier's,
  // whose callbacks took 24% of the batches' time (traced, 2026-12-07).
  void StartPieces(Task t, char* buf) {
    auto self = shared_from_this();
    auto run = std::make_shared<std::unique_ptr<gpu::Copier::Run>>();
    Task h = StandIn(t, buf, [self, t, buf, run](const Status& s) {
      FERRY_TRACE(trace::kStagedReadIn, reinterpret_cast<uint64_t>(t.local));
      auto landed = [self, t, buf, s](const Status& copied) {
        FERRY_TRACE(trace::kLandCopyDone, reinterpret_cast<uint64_t>(t.local));
        self->Release(buf, self->CapFor(t));
        t.Done(s.ok() ? copied : s);
      };
      if (*run == nullptr) {  // no piece came in, so no copy reads `buf`
        return landed(s.ok() ? Status::Internal("a read's payload came with no pieces") : s);
      }
      // A failed receive still waits for the copies it started, which read `buf`.
      (*run)->End(std::move(landed));
    });
    h.piece = read_piece_;
    h.on_piece = std::make_shared<std::function<void(uint64_t, uint64_t)>>(
        [self, t, buf, run](uint64_t at, uint64_t n) {
          if (*run == nullptr) *run = self->copier_->StartRun(t.gpu_device, t.ready);
          (void)(*run)->Add(t.local + at, buf + at, n);
        });
    LanesFor(t).Post({std::move(h)});
  }

  const std::shared_ptr<LaneGroup> host_;
  const std::shared_ptr<LaneGroup> gpu_;  // host_ where the lanes are the same
  gpu::Copier* copier_;
  const std::shared_ptr<StagingPool> staging_;  // the transport's; null without a GPU
  std::mutex cap_mu_;
  Cap gpu_there_, reads_here_;  // see CapFor
  ThreadPool* landing_;         // see LandStaged; null: inline
  const uint64_t read_piece_;   // a read's pieces, landing inline; 0: whole
  const LandHold land_hold_;    // see LandStaged
};

// Thread counts that grow with the machine.
int OnePerFourCores(int lo, int hi) { return std::clamp(cpus::Parallel() / 4, lo, hi); }

// The lanes per peer, and of those the ones that carry chunks touching GPU
// memory. (An engine resolves tcp_lanes before it makes its transports; a
// transport made on bare options, as tests do, resolves it here.)
int Lanes(const EngineOptions& o) { return EffectiveTcpLanes(o.tcp_lanes); }
int GpuLanes(const EngineOptions& o) { return std::min(o.tcp_gpu_lanes, Lanes(o)); }

class TcpTransport : public Transport {
 public:
  static constexpr char kName[] = "tcp";

  explicit TcpTransport(EngineContext& ctx) : ctx_(ctx) {
    const EngineOptions& o = ctx.options;
    caps_.name = kName;
    caps_.priority = 30;
    caps_.max_task_bytes = ctx.options.tcp_chunk_bytes;
    caps_.max_gpu_task_bytes = ctx.options.tcp_gpu_chunk_bytes;
    caps_.gpu_memory = ctx.copier != nullptr;  // local GPU memory, through staging
    caps_.reach = Reach::kNetwork;
    caps_.target_stages_gpu = true;  // the target side stages its GPU memory
    caps_.io_threads = DefaultIoThreads(cpus::Parallel(), Lanes(o));
    if (ctx.copier != nullptr) {
      const int landing =
          o.landing_threads < 0 ? OnePerFourCores(2, std::max(2, GpuLanes(o))) : o.landing_threads;
      if (landing > 0) landing_ = std::make_unique<ThreadPool>(landing, "ferry-landing");
    }
    TcpTarget::Config tc;
    tc.staging_bytes = ctx.options.tcp_gpu_chunk_bytes;
    // One peer's lanes, each with the window of requests to GPU memory as far
    // as a connection can use it; 16 at least, 64 at most.
    const size_t per_lane = std::min<size_t>(
        static_cast<size_t>(Lane::GpuWindow(ctx.options.tcp_chunks_in_flight)), kMaxQueuedReplies);
    tc.staging_buffers = std::clamp<size_t>(static_cast<size_t>(GpuLanes(o)) * per_lane, 16, 64);
    tc.landing = landing_.get();
    tc.land_hold = land_hold_;
    target_ = std::make_unique<TcpTarget>(tc, ctx.registry, ctx.copier);
  }

  Status CheckOptions() const override {
    const EngineOptions& o = ctx_.options;
    if (o.tcp_lanes < 1 || o.tcp_gpu_lanes < 1 || o.tcp_chunks_in_flight < 0 ||
        o.tcp_chunk_bytes < 4096 || o.tcp_chunk_bytes > (64u << 20) ||
        o.tcp_gpu_chunk_bytes < 4096 || o.tcp_gpu_chunk_bytes > (64u << 20) ||
        o.tcp_staging_buffers < 0 || o.tcp_staging_buffers > 4096) {
      return Status::InvalidArgument("tcp options out of range");
    }
    return Status::Ok();
  }

  const TransportCaps& caps() const override { return caps_; }

  FrameService* frame_service() override { return target_.get(); }

  Status ConfineHelpers(const std::vector<int>& cpus) override {
    return landing_ ? landing_->Confine(cpus) : Status::Ok();
  }

  // Landing jobs use target_'s staging and answer on listener connections.
  void Stop() override { landing_.reset(); }

  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return d && d->Offers(kName);
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    asio::error_code ec;
    auto addr = asio::ip::make_address(segment->host(), ec);
    if (ec) return Status::InvalidArgument("bad peer address " + segment->host());
    Lane::Config cfg;
    cfg.peer = asio::ip::tcp::endpoint(addr, segment->port());
    cfg.peer_name = segment->name();
    cfg.epoch = segment->descriptor()->epoch;
    cfg.gpu_window = Lane::GpuWindow(ctx_.options.tcp_chunks_in_flight);
    cfg.checksum = ctx_.options.tcp_checksum;
    cfg.rcv_lowat_ceiling = RcvLowatCeiling(ctx_.options.io_spin_us);
    cfg.connect_timeout = ctx_.options.connect_timeout;
    cfg.progress_timeout = ctx_.options.request_timeout;
    cfg.key = ctx_.key;
    const bool shared = ChunkQueue::Shared(ctx_.io.threads());
    // Narrow windows only where a shared queue balances the lanes. On the
    // 2-core VM with one io thread, its lanes sharing no queue, 5 rounds: 2
    // in flight against 4 tied at 1 MiB writes and lost reads (0.72 against
    // 0.80 of raw streams, 4 of 5 rounds); 64 KiB chunks filling 256 KiB
    // against 1 MiB lost every round (writes 0.71 against 1.09). With an
    // io thread per core and a shared queue, the wide windows lost there.
    // FERRY_TCP_WINDOW_KIB sets the small chunks' bytes.
    cfg.max_in_flight = Lane::ChunksInFlight(ctx_.options.tcp_chunks_in_flight, shared);
    static const int64_t window_kib = env::GetIntIn("FERRY_TCP_WINDOW_KIB", 64, 16384, -1);
    cfg.small_window_bytes = Lane::SmallWindowBytes(window_kib, shared);
    cfg.small_window_follows_share = shared && window_kib < 0;
    auto group = [&](int n) {
      auto g = std::make_shared<LaneGroup>();
      for (int i = 0; i < n; ++i) {
        if (!shared || g->queues.empty()) {
          g->queues.push_back(std::make_shared<ChunkQueue>(shared ? static_cast<size_t>(n) : 1));
        }
        g->lanes.push_back(std::make_shared<Lane>(ctx_.io.Next(), cfg, segment, g->queues.back()));
      }
      return g;
    };
    const int gpu_lanes = GpuLanes(ctx_.options);
    auto host = group(Lanes(ctx_.options));
    auto gpu = gpu_lanes < Lanes(ctx_.options) ? group(gpu_lanes) : host;
    // One window of GPU requests a lane, in staging buffers.
    const int lane_windows = Lanes(ctx_.options) * cfg.gpu_window;
    std::shared_ptr<StagingPool> staging = Staging(lane_windows);
    return std::shared_ptr<Endpoint>(std::make_shared<TcpEndpoint>(
        std::move(host), std::move(gpu), ctx_.copier, std::move(staging),
        static_cast<size_t>(gpu_lanes * cfg.gpu_window), static_cast<size_t>(lane_windows),
        ReadsLandInline() ? nullptr : landing_.get(), read_piece_, land_hold_));
  }

 private:
  // The pool that every peer's staged chunks take their buffers from, made
  // with the first peer's endpoint; null without a GPU or without the
  // memory (retried with the next peer).
  std::shared_ptr<StagingPool> Staging(int lane_windows) {
    if (ctx_.copier == nullptr) return nullptr;
    std::lock_guard lk(staging_mu_);
    if (staging_ != nullptr) return staging_;
    // Two windows of GPU requests for each lane that may carry staged
    // chunks: those whose far end is host memory take all the lanes. Each
    // holds a buffer from its copy until its reply, and the copies queue
    // behind one another (traced on an H100, 1 MiB x 128 with GPU memory
    // here only: 44 of 58 buffers held waited for their copy out). There,
    // one window a lane against half that (64 buffers against 32) moved
    // those writes 17.9 -> 20.7 GB/s and reads into GPU memory here 18.7 ->
    // 20.5, every round; two against one (128 against 64) moved the writes
    // 21.5 -> 22.6, 22.1 -> 24.1 and 24.0 -> 31.3 on three leases, 9 of 9
    // rounds ahead, but the reads 20.9 -> 18.8, 3 of 3 behind, so reads
    // keep to one window a lane (capped, 30.3 -> 30.4).
    // With GPU memory at both ends one window a lane lost writes 19.0 ->
    // 17.4, so chunks into GPU memory there keep to the GPU lanes' windows.
    // One peer's worth for all: peers that move at once share it (taken in
    // request order), where a pool each pinned 128 MiB a peer by default.
    const int buffers =
        ctx_.options.tcp_staging_buffers > 0 ? ctx_.options.tcp_staging_buffers : 2 * lane_windows;
    auto pool = StagingPool::Create(static_cast<size_t>(buffers), ctx_.options.tcp_gpu_chunk_bytes);
    if (!pool.ok()) {
      FERRY_LOG_WARN("tcp: no pinned staging for GPU memory: {}", pool.status().ToString());
      return nullptr;
    }
    staging_ = std::move(pool).value();
    return staging_;
  }

  EngineContext& ctx_;
  TransportCaps caps_;
  std::unique_ptr<TcpTarget> target_;  // our end for peers' lanes, on the listener
  // Lands received staging in GPU memory; null without a GPU, with
  // landing_threads 0 (inline), or once stopped. Declared after target_,
  // whose staging its jobs use.
  std::unique_ptr<ThreadPool> landing_;
  const uint64_t read_piece_ = ReadPieceBytes();  // read once an engine
  const LandHold land_hold_ = LandHoldFromEnv();  // read once an engine
  std::mutex staging_mu_;
  std::shared_ptr<StagingPool> staging_;  // guarded by staging_mu_; see Staging
};

}  // namespace

FERRY_REGISTER_TRANSPORT(TcpTransport);

}  // namespace ferry
