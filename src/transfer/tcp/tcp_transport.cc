// The tcp transport: reaches any peer whose listener it can connect to. Each
// request is sliced into chunks (tcp_chunk_bytes) spread round-robin over the
// peer's lanes (tcp_lanes), each lane keeping tcp_chunks_in_flight on the wire.
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>

#include "common/log.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/segment.h"
#include "transfer/tcp/lane.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

// Pinned buffers of one chunk each, made when the endpoint is, so GPU chunks
// never allocate on the data path.
class StagingRing {
 public:
  static std::unique_ptr<StagingRing> Create(size_t count, size_t bytes) {
    auto r = std::unique_ptr<StagingRing>(new StagingRing());
    for (size_t i = 0; i < count; ++i) {
      auto p = gpu::AllocPinned(bytes);
      if (!p.ok()) {
        FERRY_LOG_WARN("tcp: no pinned staging for GPU memory: {}", p.status().ToString());
        return nullptr;
      }
      r->all_.push_back(static_cast<char*>(p.value()));
    }
    r->free_ = r->all_;
    return r;
  }
  ~StagingRing() {
    for (char* p : all_) gpu::FreePinned(p);
  }
  char* TryTake() {
    if (free_.empty()) return nullptr;
    char* p = free_.back();
    free_.pop_back();
    return p;
  }
  void Give(char* p) { free_.push_back(p); }

 private:
  StagingRing() = default;
  std::vector<char*> all_;
  std::vector<char*> free_;
};

// GPU memory over tcp goes through the staging ring: a write's chunk is copied
// device-to-host on a private stream after the readiness event, then sent; a
// read's chunk lands in staging, then is copied host-to-device after the
// readiness event (R2). With several chunks staged at once, the copy of chunk
// k+1 overlaps the send of chunk k. A GPU write completes when the target has
// acknowledged it; a GPU read once the bytes are in device memory (R3).
class TcpEndpoint : public Endpoint, public std::enable_shared_from_this<TcpEndpoint> {
 public:
  TcpEndpoint(std::vector<std::shared_ptr<Lane>> lanes, gpu::Copier* copier,
              std::unique_ptr<StagingRing> staging)
      : lanes_(std::move(lanes)), copier_(copier), staging_(std::move(staging)) {}
  ~TcpEndpoint() override { Close(); }

  void Post(std::vector<Task> tasks) override {
    std::vector<Task> host;
    host.reserve(tasks.size());
    for (auto& t : tasks) {
      if (t.gpu_device < 0) {
        host.push_back(std::move(t));
      } else if (!t.gpu_local) {
        t.Done(
            Status(StatusCode::kNotSupported, "GPU memory at a tcp target is not supported yet"));
      } else if (copier_ == nullptr || staging_ == nullptr) {
        t.Done(Status(StatusCode::kNotSupported, "no pinned staging for GPU memory over tcp"));
      } else {
        Stage(std::move(t));
      }
    }
    if (!host.empty()) PostHost(std::move(host));
  }

  void Close() override {
    for (auto& l : lanes_) l->Close();
  }

 private:
  void PostHost(std::vector<Task> tasks) {
    const size_t n = lanes_.size();
    if (tasks.size() == 1) {
      lanes_[next_.fetch_add(1, std::memory_order_relaxed) % n]->Post(std::move(tasks));
      return;
    }
    std::vector<std::vector<Task>> per(n);
    size_t start = next_.fetch_add(tasks.size(), std::memory_order_relaxed);
    for (size_t i = 0; i < tasks.size(); ++i) per[(start + i) % n].push_back(std::move(tasks[i]));
    for (size_t i = 0; i < n; ++i) {
      if (!per[i].empty()) lanes_[i]->Post(std::move(per[i]));
    }
  }

  void Stage(Task t) {
    char* buf;
    {
      std::lock_guard lk(mu_);
      buf = staging_->TryTake();
      if (buf == nullptr) {
        waiting_.push_back(std::move(t));
        return;
      }
    }
    Start(std::move(t), buf);
  }

  // Hands a freed buffer to the next waiting chunk, or back to the ring.
  void Release(char* buf) {
    Task next;
    {
      std::lock_guard lk(mu_);
      if (waiting_.empty()) {
        staging_->Give(buf);
        return;
      }
      next = std::move(waiting_.front());
      waiting_.pop_front();
    }
    Start(std::move(next), buf);
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
      self->copier_->CopyAsync(t.local, buf, t.length, t.gpu_device, t.ready,
                               [self, t, buf](const Status& s2) {
                                 self->Release(buf);
                                 t.Done(s2);
                               });
    })});
  }

  std::vector<std::shared_ptr<Lane>> lanes_;
  std::atomic<size_t> next_{0};
  gpu::Copier* copier_;
  std::unique_ptr<StagingRing> staging_;  // null without a GPU
  std::mutex mu_;
  std::deque<Task> waiting_;  // GPU chunks waiting for a staging buffer; guarded by mu_
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(EngineContext& ctx) : ctx_(ctx) {
    caps_.kind = TransportKind::kTcp;
    caps_.name = "tcp";
    caps_.priority = 30;
    caps_.max_task_bytes = ctx.options.tcp_chunk_bytes;
    caps_.gpu_memory = ctx.copier != nullptr;  // local GPU memory, through staging
  }

  const TransportCaps& caps() const override { return caps_; }

  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return d && d->Offers("tcp");
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    asio::error_code ec;
    auto addr = asio::ip::make_address(segment->host(), ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "bad peer address " + segment->host());
    Lane::Config cfg;
    cfg.peer = asio::ip::tcp::endpoint(addr, segment->port());
    cfg.peer_name = segment->name();
    cfg.epoch = segment->descriptor()->epoch;
    cfg.max_in_flight = ctx_.options.tcp_chunks_in_flight;
    cfg.connect_timeout = ctx_.options.connect_timeout;
    cfg.progress_timeout = ctx_.options.request_timeout;
    std::vector<std::shared_ptr<Lane>> lanes;
    for (int i = 0; i < ctx_.options.tcp_lanes; ++i) {
      lanes.push_back(std::make_shared<Lane>(ctx_.io, cfg, segment));
    }
    std::unique_ptr<StagingRing> staging;
    if (ctx_.copier != nullptr) {
      // Two chunks per in-flight slot: one on the wire while the next is copied.
      staging = StagingRing::Create(
          static_cast<size_t>(ctx_.options.tcp_lanes * ctx_.options.tcp_chunks_in_flight * 2),
          ctx_.options.tcp_chunk_bytes);
    }
    return std::shared_ptr<Endpoint>(
        std::make_shared<TcpEndpoint>(std::move(lanes), ctx_.copier, std::move(staging)));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(tcp, TcpTransport);

}  // namespace ferry
