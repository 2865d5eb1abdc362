// The tcp transport: reaches any peer whose listener it can connect to. Each
// request is sliced into chunks (tcp_chunk_bytes) spread round-robin over the
// peer's lanes (tcp_lanes), each lane keeping tcp_chunks_in_flight on the wire.
// Both ends live here: the initiator's endpoint and lanes (lane.h), and the
// target side that serves their frames on the engine's listener (target.h).
#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>

#include "common/env.h"
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
  TcpEndpoint(std::vector<std::shared_ptr<Lane>> lanes,
              std::vector<std::shared_ptr<ChunkQueue>> queues, gpu::Copier* copier,
              std::unique_ptr<StagingPool> staging, ThreadPool* landing)
      : lanes_(std::move(lanes)),
        queues_(std::move(queues)),
        copier_(copier),
        staging_(std::move(staging)),
        landing_(landing) {}
  ~TcpEndpoint() override { Close(); }

  void Post(std::vector<Task> tasks) override {
    std::vector<Task> host;
    host.reserve(tasks.size());
    for (auto& t : tasks) {
      if (!t.gpu_local) {
        host.push_back(std::move(t));
      } else if (copier_ == nullptr || staging_ == nullptr) {
        t.Done(Status::NotSupported("no pinned staging for GPU memory over tcp"));
      } else {
        Stage(std::move(t));
      }
    }
    if (!host.empty()) PostHost(std::move(host));
  }

  void Close() override {
    for (auto& q : queues_) q->Close();
    for (auto& l : lanes_) l->Close();
  }

 private:
  // A shared queue wakes as many lanes as there are tasks, round-robin:
  // the lanes that wake take what their windows allow, and each lane takes
  // more as its replies come. Otherwise each lane has a queue of its own
  // and gets every n-th task, as before the shared queue.
  void PostHost(std::vector<Task> tasks) {
    const size_t n = lanes_.size();
    const size_t start = next_.fetch_add(tasks.size(), std::memory_order_relaxed);
    if (queues_.size() == 1) {
      const size_t wake = std::min(tasks.size(), n);
      queues_[0]->Push(std::move(tasks));
      for (size_t i = 0; i < wake; ++i) lanes_[(start + i) % n]->Kick();
      return;
    }
    std::vector<std::vector<Task>> per(n);
    for (size_t i = 0; i < tasks.size(); ++i) per[(start + i) % n].push_back(std::move(tasks[i]));
    for (size_t i = 0; i < n; ++i) {
      if (per[i].empty()) continue;
      queues_[i]->Push(std::move(per[i]));
      lanes_[i]->Kick();
    }
  }

  void Stage(Task t) {
    staging_->Take([self = shared_from_this(), t = std::move(t)](char* buf) mutable {
      self->Start(std::move(t), buf);
    });
  }

  void Release(char* buf) { staging_->Give(buf); }

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

  void Start(Task t, char* buf) {
    auto self = shared_from_this();
    if (t.op == Op::kWrite) {
      copier_->CopyAsync(buf, t.local, t.length, t.gpu_device, t.ready,
                         [self, t, buf](const Status& st) {
                           if (!st.ok()) {
                             self->Release(buf);
                             return t.Done(st);
                           }
                           self->PostHost({self->StandIn(t, buf, [self, t, buf](const Status& s) {
                             self->Release(buf);
                             t.Done(s);
                           })});
                         });
      return;
    }
    PostHost({StandIn(t, buf, [self, t, buf](const Status& s) {
      if (!s.ok()) {
        self->Release(buf);
        return t.Done(s);
      }
      LandStaged(self->landing_, *self->copier_, t.local, buf, t.length, t.gpu_device, t.ready,
                 [self, t, buf](const Status& s2) {
                   self->Release(buf);
                   t.Done(s2);
                 });
    })});
  }

  std::vector<std::shared_ptr<Lane>> lanes_;
  std::vector<std::shared_ptr<ChunkQueue>> queues_;  // one shared, or one per lane
  std::atomic<size_t> next_{0};
  gpu::Copier* copier_;
  std::unique_ptr<StagingPool> staging_;  // null without a GPU
  ThreadPool* landing_;                   // see LandStaged; null: inline
};

// Thread counts that grow with the machine.
int OnePerFourCores(int lo, int hi) {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, lo, hi);
}

// A lane's socket keeps one io thread busy at large chunks (86% on the H200
// machine), so lanes get a thread each where half the cores allow: 8 lanes
// on 16 cores moved 23.0 GB/s with 8 threads and 14.1 with 4
// (docs/performance.md).
int OnePerTwoCores(int lo, int hi) {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, lo, hi);
}

class TcpTransport : public Transport {
 public:
  static constexpr char kName[] = "tcp";

  explicit TcpTransport(EngineContext& ctx) : ctx_(ctx) {
    const EngineOptions& o = ctx.options;
    caps_.name = kName;
    caps_.priority = 30;
    caps_.max_task_bytes = ctx.options.tcp_chunk_bytes;
    caps_.gpu_memory = ctx.copier != nullptr;  // local GPU memory, through staging
    caps_.reach = Reach::kNetwork;
    caps_.target_stages_gpu = true;  // the target side stages its GPU memory
    caps_.io_threads = OnePerTwoCores(1, o.tcp_lanes);
    if (ctx.copier != nullptr) {
      const int landing =
          o.landing_threads < 0 ? OnePerFourCores(2, std::max(2, o.tcp_lanes)) : o.landing_threads;
      if (landing > 0) landing_ = std::make_unique<ThreadPool>(landing, "ferry-landing");
    }
    TcpTarget::Config tc;
    tc.staging_bytes = ctx.options.tcp_chunk_bytes;
    // One peer's lanes, each with the doubled window of requests to GPU memory
    // as far as a connection can use it; 16 at least, 64 at most.
    const size_t per_lane = std::min<size_t>(
        2 * static_cast<size_t>(ctx.options.tcp_chunks_in_flight), kMaxQueuedReplies);
    tc.staging_buffers =
        std::clamp<size_t>(static_cast<size_t>(ctx.options.tcp_lanes) * per_lane, 16, 64);
    tc.landing = landing_.get();
    target_ = std::make_unique<TcpTarget>(tc, ctx.registry, ctx.copier);
  }

  Status CheckOptions() const override {
    const EngineOptions& o = ctx_.options;
    if (o.tcp_lanes < 1 || o.tcp_chunks_in_flight < 1 || o.tcp_chunk_bytes < 4096 ||
        o.tcp_chunk_bytes > (64u << 20)) {
      return Status::InvalidArgument("tcp options out of range");
    }
    return Status::Ok();
  }

  const TransportCaps& caps() const override { return caps_; }

  FrameService* frame_service() override { return target_.get(); }

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
    cfg.max_in_flight = ctx_.options.tcp_chunks_in_flight;
    cfg.checksum = ctx_.options.tcp_checksum;
    cfg.connect_timeout = ctx_.options.connect_timeout;
    cfg.progress_timeout = ctx_.options.request_timeout;
    cfg.key = ctx_.key;
    // FERRY_TCP_SHARED_QUEUE: 1, a peer's lanes take chunks from one queue;
    // 0, they are dealt out round-robin, a queue per lane. Unset: shared where
    // the lanes run on more than one io thread, where one lane can fall
    // behind another (H200, 4 lanes on 4 threads: 1 MiB writes 0.70 -> 0.75
    // of raw streams). On one thread there is nothing to balance, and the
    // 2-core VM's 1 MiB reads measured slower shared (0.72 against 0.83).
    static const int64_t knob = env::GetIntIn("FERRY_TCP_SHARED_QUEUE", 0, 1, -1);
    const bool shared = knob == 1 || (knob == -1 && ctx_.io.threads() > 1);
    std::vector<std::shared_ptr<Lane>> lanes;
    std::vector<std::shared_ptr<ChunkQueue>> queues;
    for (int i = 0; i < ctx_.options.tcp_lanes; ++i) {
      if (!shared || queues.empty()) {
        queues.push_back(
            std::make_shared<ChunkQueue>(shared ? static_cast<size_t>(ctx_.options.tcp_lanes) : 1));
      }
      lanes.push_back(std::make_shared<Lane>(ctx_.io.Next(), cfg, segment, queues.back()));
    }
    std::unique_ptr<StagingPool> staging;
    if (ctx_.copier != nullptr) {
      // Two chunks per in-flight slot: one on the wire while the next is copied.
      auto pool = StagingPool::Create(
          static_cast<size_t>(ctx_.options.tcp_lanes * ctx_.options.tcp_chunks_in_flight * 2),
          ctx_.options.tcp_chunk_bytes);
      if (pool.ok()) {
        staging = std::move(pool).value();
      } else {
        FERRY_LOG_WARN("tcp: no pinned staging for GPU memory: {}", pool.status().ToString());
      }
    }
    return std::shared_ptr<Endpoint>(std::make_shared<TcpEndpoint>(
        std::move(lanes), std::move(queues), ctx_.copier, std::move(staging), landing_.get()));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
  std::unique_ptr<TcpTarget> target_;  // our end for peers' lanes, on the listener
  // Lands received staging in GPU memory; null without a GPU, with
  // landing_threads 0 (inline), or once stopped. Declared after target_,
  // whose staging its jobs use.
  std::unique_ptr<ThreadPool> landing_;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(TcpTransport);

}  // namespace ferry
