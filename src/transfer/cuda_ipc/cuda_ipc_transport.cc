// The cuda_ipc transport: requests with GPU memory on a side, to a peer on the
// same host. When the segment is opened, the endpoint imports each of the
// peer's GPU allocations from its CUDA IPC handle and maps each memfd buffer,
// page-locking it for the GPU; requests then become cudaMemcpyAsync on the
// engine's private streams, after the submission stream's readiness event.
// Nothing on the data path opens, registers or synchronizes (R4).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>

#include "common/host.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/copy_task.h"
#include "transfer/peer_memfd.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

class CudaIpcEndpoint : public Endpoint, public std::enable_shared_from_this<CudaIpcEndpoint> {
 public:
  CudaIpcEndpoint(ThreadPool& pool, gpu::Copier& copier, std::string name, uint32_t pid)
      : pool_(pool), copier_(copier), name_(std::move(name)), pid_(pid) {}

  ~CudaIpcEndpoint() override {
    for (auto& [addr, m] : maps_) {
      if (m.ipc_base != nullptr) {
        gpu::CloseIpc(m.ipc_base, m.device);
      } else {
        if (m.pinned) gpu::UnpinHost(m.base);
        munmap(m.base, m.length);
      }
    }
  }

  // Imports what the descriptor offers. Regions that cannot be imported stay
  // unreachable, and their requests fail with NotSupported.
  void Import(const SegmentDescriptor& d) {
    for (const RegionDesc& r : d.regions) {
      Mapping m;
      m.length = r.length;
      if (r.kind == static_cast<uint8_t>(gpu::MemoryKind::kDevice) && !r.ipc.empty()) {
        m.device = r.device >= 0 && r.device < gpu::DeviceCount() ? r.device : 0;
        auto base = gpu::OpenIpc(r.ipc, m.device);
        if (!base.ok()) {
          FERRY_LOG_WARN("cuda_ipc: {}: {}", name_, base.status().ToString());
          continue;
        }
        m.ipc_base = base.value();
        m.base = static_cast<char*>(base.value()) + r.ipc_offset;
      } else if (r.memfd >= 0) {
        auto p = MapPeerMemfd(pid_, r.memfd, r.length);
        if (!p.ok()) {
          FERRY_LOG_WARN("cuda_ipc: {}: {}", name_, p.status().ToString());
          continue;
        }
        m.base = p.value();
        m.pinned = gpu::PinHost(m.base, r.length);
      } else {
        continue;  // pageable heap of another process: no GPU path to it yet
      }
      maps_[r.addr] = m;
    }
  }

  // A copy whose both sides are GPU or page-locked memory cannot block, so it
  // is enqueued from the submitting thread; any other goes to a copy thread.
  void Post(std::vector<Task> tasks) override {
    for (auto& t : tasks) {
      uint64_t region = 0;
      const Mapping* m = t.gpu_local ? Lookup(t.remote, t.length, &region) : nullptr;
      if (m != nullptr && (m->ipc_base != nullptr || m->pinned)) {
        Run(t);
      } else {
        pool_.Post([self = shared_from_this(), t = std::move(t)] { self->Run(t); });
      }
    }
  }

  void Close() override { closed_.store(true, std::memory_order_release); }

  Result<void*> MapForStream(uint64_t remote, uint64_t length) override {
    if (closed_.load(std::memory_order_acquire)) {
      return Status(StatusCode::kCancelled, "segment closed");
    }
    uint64_t region = 0;
    const Mapping* m = Lookup(remote, length, &region);
    if (m == nullptr) {
      return Status(StatusCode::kOutOfRange,
                    fmt::format("0x{:x}+{} is not GPU-reachable at {}", remote, length, name_));
    }
    return static_cast<void*>(m->base + (remote - region));
  }

 private:
  struct Mapping {
    char* base = nullptr;      // the region's first byte, as mapped here
    void* ipc_base = nullptr;  // the imported allocation, for CloseIpc
    uint64_t length = 0;
    int device = -1;
    bool pinned = false;
  };

  const Mapping* Lookup(uint64_t remote, uint64_t length, uint64_t* region) const {
    auto it = maps_.upper_bound(remote);
    if (it == maps_.begin()) return nullptr;
    --it;
    if (remote + length > it->first + it->second.length) return nullptr;
    *region = it->first;
    return &it->second;
  }

  void Run(const Task& t) {
    Status st = CheckRunnable(t, closed_.load(std::memory_order_acquire));
    if (st.ok() && kill(static_cast<pid_t>(pid_), 0) != 0 && errno == ESRCH) {
      st = Status(StatusCode::kConnectionLost, name_ + " has exited");
    }
    const Mapping* m = nullptr;
    uint64_t region = 0;
    if (st.ok()) {
      m = Lookup(t.remote, t.length, &region);
      if (m == nullptr) {
        st = Status(StatusCode::kOutOfRange,
                    fmt::format("0x{:x}+{} is not GPU-reachable at {}", t.remote, t.length, name_));
      }
    }
    if (!st.ok()) return t.Done(st);
    char* remote = m->base + (t.remote - region);
    void* dst = t.op == Op::kWrite ? remote : t.local;
    const void* src = t.op == Op::kWrite ? static_cast<const void*>(t.local) : remote;
    copier_.CopyAsync(dst, src, t.length, t.gpu_device >= 0 ? t.gpu_device : m->device, t.ready,
                      [t](const Status& s) { t.Done(s); });
  }

  ThreadPool& pool_;
  gpu::Copier& copier_;
  const std::string name_;
  const uint32_t pid_;
  std::atomic<bool> closed_{false};
  std::map<uint64_t, Mapping> maps_;  // by remote address; written before the first Post
};

class CudaIpcTransport : public Transport {
 public:
  explicit CudaIpcTransport(EngineContext& ctx) : ctx_(ctx) {
    caps_.kind = TransportKind::kCudaIpc;
    caps_.name = "cuda_ipc";
    caps_.priority = 15;
    caps_.max_task_bytes = 64ull << 20;
    caps_.host_memory = false;
    caps_.gpu_memory = true;
  }

  const TransportCaps& caps() const override { return caps_; }

  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return ctx_.copier != nullptr && d && d->Offers("cuda_ipc") && d->host_id == HostIdentity() &&
           d->pid != static_cast<uint32_t>(getpid());
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    auto d = segment->descriptor();
    auto ep =
        std::make_shared<CudaIpcEndpoint>(ctx_.copy_pool, *ctx_.copier, segment->name(), d->pid);
    ep->Import(*d);
    return std::shared_ptr<Endpoint>(std::move(ep));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(cuda_ipc, CudaIpcTransport);

}  // namespace ferry
