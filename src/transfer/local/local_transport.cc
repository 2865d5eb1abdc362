// The local transport: a segment opened on the engine itself. Copies run on the
// copy pool after the same range check the listener applies to peers.
#include "common/log.h"
#include "common/thread_pool.h"
#include "transfer/copy_task.h"
#include "transfer/memory_registry.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

class LocalEndpoint : public Endpoint, public std::enable_shared_from_this<LocalEndpoint> {
 public:
  LocalEndpoint(ThreadPool& pool, const MemoryRegistry& registry, gpu::Copier* copier)
      : pool_(pool), registry_(registry), copier_(copier) {}

  // Copies run on the copy pool, never the submitting thread: even an
  // asynchronous GPU copy from pageable memory can block its caller.
  void Post(std::vector<Task> tasks) override {
    for (auto& t : tasks) {
      pool_.Post([self = shared_from_this(), t = std::move(t)] { self->Run(t); });
    }
  }

  void Close() override { closed_.store(true, std::memory_order_release); }

  Result<Mapped> MapForStream(uint64_t remote, uint64_t length) override {
    if (!registry_.Find(remote, length)) {
      return Status::OutOfRange(fmt::format("0x{:x}+{} is not registered locally", remote, length));
    }
    return Mapped{reinterpret_cast<void*>(remote), nullptr};
  }

 private:
  void Run(const Task& t) const {
    Status st = CheckRunnable(t, closed_.load(std::memory_order_acquire));
    if (st.ok() && !registry_.Find(t.remote, t.length)) {
      st = Status::OutOfRange(
          fmt::format("0x{:x}+{} is not registered locally", t.remote, t.length));
    }
    if (!st.ok()) return t.Done(st);
    char* remote = reinterpret_cast<char*>(t.remote);
    if (t.gpu_device < 0) {
      CopyTask(t, remote);
      return t.Done(Status::Ok());
    }
    // GPU memory on a side: a private stream waits for the submission stream's
    // event, and the task completes once the copy has finished (R1-R3).
    void* dst = t.op == Op::kWrite ? remote : t.local;
    const void* src = t.op == Op::kWrite ? static_cast<const void*>(t.local) : remote;
    copier_->CopyAsync(dst, src, t.length, t.gpu_device, t.ready,
                       [t](const Status& s) { t.Done(s); });
  }

  ThreadPool& pool_;
  const MemoryRegistry& registry_;
  gpu::Copier* copier_;
  std::atomic<bool> closed_{false};
};

class LocalTransport : public Transport {
 public:
  static constexpr char kName[] = "local";

  explicit LocalTransport(EngineContext& ctx) : ctx_(ctx) {
    caps_.name = kName;
    caps_.priority = 10;
    caps_.max_task_bytes = 8ull << 20;
    caps_.gpu_memory = true;  // through the engine's GPU copier
    caps_.reach = Reach::kProcess;
    caps_.stream_path = StreamPath::kMapped;  // the address is ours
  }

  const TransportCaps& caps() const override { return caps_; }
  bool CanReach(const Segment& segment) const override { return segment.is_self(); }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>&) override {
    return std::shared_ptr<Endpoint>(
        std::make_shared<LocalEndpoint>(ctx_.copy_pool, ctx_.registry, ctx_.copier));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(LocalTransport);

}  // namespace ferry
