// The cuda_ipc transport: requests with GPU memory on a side, to a peer on the
// same host. When the segment is opened, the endpoint imports each of the
// peer's GPU allocations from its CUDA IPC handle and maps each memfd buffer,
// page-locking it for the GPU; requests then become cudaMemcpyAsync on the
// engine's private streams, after the submission stream's readiness event.
// When the peer's registrations change, the endpoint follows (Follow): new
// regions are imported, regions still registered keep their imports, and
// those of removed regions are released once no copy uses them. The engine's
// watch thread makes those changes (peers.h, WatchRound); nothing on the data
// path opens, registers or synchronizes (R4).
//
// A region's blob, written when the owner registered it: 'G', the CUDA IPC
// handle of its allocation and its offset there, for device memory; 'M' and
// the owner's fd number, for a memfd buffer; empty for other memory.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <optional>

#include "common/bytes.h"
#include "common/host.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/copy_task.h"
#include "transfer/memory_registry.h"
#include "transfer/peer_memfd.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

constexpr uint8_t kDeviceBlob = 'G';
constexpr uint8_t kMemfdBlob = 'M';
constexpr size_t kMaxIpcHandle = 64;

// What a region's blob says: an IPC handle and offset, or a memfd, or neither.
struct Reachable {
  std::string ipc;
  uint64_t ipc_offset = 0;
  int32_t memfd = -1;
};

std::string Encode(const Reachable& r) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  if (!r.ipc.empty()) {
    w.U8(kDeviceBlob);
    w.Str(r.ipc);
    w.U64(r.ipc_offset);
  } else if (r.memfd >= 0) {
    w.U8(kMemfdBlob);
    w.I32(r.memfd);
  }
  return std::string(out.begin(), out.end());
}

// Nothing reachable for an empty or malformed blob.
Reachable Decode(std::string_view blob) {
  ByteReader in(reinterpret_cast<const uint8_t*>(blob.data()), blob.size());
  Reachable r;
  const uint8_t tag = in.U8();
  if (tag == kDeviceBlob) {
    r.ipc = in.Str(kMaxIpcHandle);
    r.ipc_offset = in.U64();
  } else if (tag == kMemfdBlob) {
    r.memfd = static_cast<int32_t>(in.U32());
  }
  if (!in.ok() || in.Left() != 0 || r.memfd < -1) return {};
  return r;
}

// One peer allocation (by IPC handle) or memfd buffer, mapped here. Shared by
// the regions that lie in it and by the copies using them; the last holder
// hands it to the reaper thread to unmap, because cudaIpcCloseMemHandle and
// cudaHostUnregister may wait on the device, and that holder can be the
// copier's completion thread or a submitting one.
struct Import {
  char* base = nullptr;  // the allocation's base, or the buffer's first byte
  uint64_t length = 0;   // memfd buffers: the mapping's length
  void* ipc = nullptr;   // set for a CUDA IPC import
  int device = -1;
  bool pinned = false;
};

std::shared_ptr<Import> Adopt(const std::shared_ptr<ThreadPool>& reaper, const Import& im) {
  // The reaper's jobs hold no Import reference, so no deleter runs on the
  // reaper itself, which the last deleter may destroy (and join).
  return std::shared_ptr<Import>(new Import(im), [reaper](Import* p) {
    reaper->Post([p] {
      if (p->ipc != nullptr) {
        gpu::CloseIpc(p->ipc, p->device);
      } else {
        if (p->pinned) gpu::UnpinHost(p->base);
        munmap(p->base, p->length);
      }
      delete p;
    });
  });
}

class CudaIpcEndpoint : public Endpoint, public std::enable_shared_from_this<CudaIpcEndpoint> {
 public:
  CudaIpcEndpoint(ThreadPool& pool, gpu::Copier& copier, std::shared_ptr<ThreadPool> reaper,
                  std::string name, uint32_t pid, const char* transport)
      : pool_(pool),
        copier_(copier),
        reaper_(std::move(reaper)),
        name_(std::move(name)),
        pid_(pid),
        transport_(transport),
        table_(std::make_shared<const Table>()) {}

  // Maps what the descriptor offers and keeps what it still offers: a region
  // is kept while its registration serial is unchanged. Regions that cannot
  // be imported stay unreachable, and their requests fail with OutOfRange.
  bool Follow(const SegmentDescriptor& d) override {
    std::lock_guard following(follow_mu_);
    std::shared_ptr<const Table> old = Snapshot();
    auto next = std::make_shared<Table>();
    for (const RegionDesc& r : d.regions) {
      auto it = old->find(r.addr);
      if (it != old->end() && it->second.serial == r.serial) {
        next->emplace(r.addr, it->second);
      } else if (auto m = Map(d, r, Decode(d.BlobOf(r, transport_)))) {
        next->emplace(r.addr, std::move(*m));
      }
    }
    std::erase_if(by_handle_, [](const auto& e) { return e.second.expired(); });
    {
      std::lock_guard lk(mu_);
      table_ = std::move(next);
    }
    return true;  // `old` goes here, or with the last copy that used it
  }

  // A copy whose both sides are GPU or page-locked memory cannot block, so it
  // is enqueued from the submitting thread, with the others of its batch on
  // that device (Copier::CopyManyAsync); any other goes to a copy thread.
  void Post(std::vector<Task> tasks) override {
    // By device and readiness: (the event, its copies).
    std::map<std::pair<int, gpu::ReadyEvent*>,
             std::pair<std::shared_ptr<gpu::ReadyEvent>, std::vector<gpu::Copier::Copy>>>
        direct;
    const bool alive = PeerAlive();  // once for the batch's direct copies
    for (auto& t : tasks) {
      auto m = t.gpu_local ? Lookup(t.remote, t.length) : nullptr;
      if (m && m->direct) {
        if (auto c = Prepare(t, std::move(m), alive)) {
          const int device = t.gpu_device >= 0 ? t.gpu_device : c->second;
          auto& group = direct[{device, t.ready.get()}];
          group.first = t.ready;
          group.second.push_back(std::move(c->first));
        }
      } else {
        pool_.Post([self = shared_from_this(), t = std::move(t)] {
          self->Run(t, self->Lookup(t.remote, t.length));
        });
      }
    }
    for (auto& [at, group] : direct) {
      copier_.CopyManyAsync(std::move(group.second), at.first, std::move(group.first));
    }
  }

  void Close() override { closed_.store(true, std::memory_order_release); }

  Result<Mapped> MapForStream(uint64_t remote, uint64_t length) override {
    if (closed_.load(std::memory_order_acquire)) {
      return Status::Cancelled("segment closed");
    }
    auto m = Lookup(remote, length);
    if (!m) return Unreachable(remote, length);
    void* addr = m->base + (remote - m->addr);
    return Mapped{addr, std::move(m)};
  }

 private:
  // One registered region of the peer, as mapped here.
  struct Mapping {
    uint64_t addr = 0;  // the peer's address of the region
    uint64_t length = 0;
    uint64_t serial = 0;
    std::shared_ptr<Import> import;
    char* base = nullptr;  // `addr` as mapped here
    int device = 0;        // the GPU the mapping is on, for copies from host memory
    bool direct = false;   // GPU or page-locked: a copy never blocks
  };
  using Table = std::map<uint64_t, Mapping>;  // by the peer's address

  std::shared_ptr<const Table> Snapshot() const {
    std::lock_guard lk(mu_);
    return table_;
  }

  // The region holding the range whole; it stays mapped while the result is held.
  std::shared_ptr<const Mapping> Lookup(uint64_t remote, uint64_t length) const {
    std::shared_ptr<const Table> t = Snapshot();
    auto it = t->upper_bound(remote);
    if (it == t->begin()) return nullptr;
    --it;
    const Mapping& m = it->second;
    if (remote - m.addr > m.length || length > m.length - (remote - m.addr)) return nullptr;
    return std::shared_ptr<const Mapping>(std::move(t), &m);
  }

  Status Unreachable(uint64_t remote, uint64_t length) const {
    return Status::OutOfRange(
        fmt::format("0x{:x}+{} is not GPU-reachable at {}", remote, length, name_));
  }

  // Imports one region of `d`, as its blob `how` says; nullopt, logged, when
  // it cannot be. Under follow_mu_.
  std::optional<Mapping> Map(const SegmentDescriptor& d, const RegionDesc& r,
                             const Reachable& how) {
    Mapping m;
    m.addr = r.addr;
    m.length = r.length;
    m.serial = r.serial;
    m.direct = true;
    if (r.kind == static_cast<uint8_t>(gpu::MemoryKind::kDevice) && !how.ipc.empty()) {
      m.device = r.device >= 0 && r.device < gpu::DeviceCount() ? r.device : 0;
      std::weak_ptr<Import>& shared = by_handle_[how.ipc];
      m.import = shared.lock();
      // Opening a handle whose close is still queued on the reaper is safe:
      // CUDA counts the opens of a handle in a context, and the pending close
      // takes back only its own.
      if (!m.import) {
        auto base = gpu::OpenIpc(how.ipc, m.device);
        if (!base.ok()) {
          FERRY_LOG_WARN("cuda_ipc: {}: {}", name_, base.status().ToString());
          return std::nullopt;
        }
        m.import = Adopt(reaper_, {static_cast<char*>(base.value()), 0, base.value(), m.device});
        shared = m.import;
      }
      m.base = m.import->base + how.ipc_offset;
    } else if (how.memfd >= 0) {
      auto p = MapPeerMemfd(d, {how.memfd, r.addr, r.serial, r.length}, kPeerMemfdTimeout);
      if (!p.ok()) {
        FERRY_LOG_WARN("cuda_ipc: {}: {}", name_, p.status().ToString());
        return std::nullopt;
      }
      const bool pinned = gpu::PinHost(p.value(), r.length);
      m.import = Adopt(reaper_, {p.value(), r.length, nullptr, -1, pinned});
      m.base = p.value();
      m.direct = pinned;
    } else {
      return std::nullopt;  // pageable heap of another process: no GPU path to it yet
    }
    return m;
  }

  // `m` is what Post found, null when nothing. The copy of `t`, which holds
  // `m` until done, and the device of the mapping; nullopt, and `t` done,
  // when it cannot run.
  std::optional<std::pair<gpu::Copier::Copy, int>> Prepare(const Task& t,
                                                           std::shared_ptr<const Mapping> m,
                                                           bool alive) {
    Status st = CheckRunnable(t, closed_.load(std::memory_order_acquire));
    if (st.ok() && !alive) st = Status::ConnectionLost(name_ + " has exited");
    if (st.ok() && !m) st = Unreachable(t.remote, t.length);
    if (!st.ok()) {
      t.Done(st);
      return std::nullopt;
    }
    char* remote = m->base + (t.remote - m->addr);
    void* dst = t.op == Op::kWrite ? remote : t.local;
    const void* src = t.op == Op::kWrite ? static_cast<const void*>(t.local) : remote;
    const int device = m->device;
    return std::pair{gpu::Copier::Copy{dst, src, t.length,
                                       [t, m = std::move(m)](const Status& s) { t.Done(s); }},
                     device};
  }

  bool PeerAlive() const { return kill(static_cast<pid_t>(pid_), 0) == 0 || errno != ESRCH; }

  void Run(const Task& t, std::shared_ptr<const Mapping> m) {
    auto c = Prepare(t, std::move(m), PeerAlive());
    if (!c) return;
    const int device = t.gpu_device >= 0 ? t.gpu_device : c->second;
    copier_.CopyAsync(c->first.dst, c->first.src, c->first.length, device, t.ready,
                      std::move(c->first.done));
  }

  ThreadPool& pool_;
  gpu::Copier& copier_;
  const std::shared_ptr<ThreadPool> reaper_;
  const std::string name_;
  const uint32_t pid_;
  const char* const transport_;  // our registered name: whose blobs to read
  std::atomic<bool> closed_{false};
  std::mutex follow_mu_;
  std::map<std::string, std::weak_ptr<Import>> by_handle_;  // guarded by follow_mu_
  mutable std::mutex mu_;
  std::shared_ptr<const Table> table_;  // guarded by mu_; replaced whole by Follow
};

class CudaIpcTransport : public Transport {
 public:
  static constexpr char kName[] = "cuda_ipc";

  explicit CudaIpcTransport(EngineContext& ctx) : ctx_(ctx) {
    caps_.name = kName;
    caps_.priority = 15;
    caps_.max_task_bytes = 64ull << 20;
    caps_.host_memory = false;
    caps_.gpu_memory = true;
    caps_.reach = Reach::kHost;
    caps_.stream_path = StreamPath::kMapped;  // copies through the imported mapping
    caps_.available = ctx.copier != nullptr;
  }

  const TransportCaps& caps() const override { return caps_; }

  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return ctx_.copier != nullptr && d && d->Offers(kName) && d->host_id == HostIdentity() &&
           d->pid != static_cast<uint32_t>(getpid());
  }

  // Exported here, at registration, never on a data path (R4). Device memory
  // that cannot be exported gets no blob: same-host peers cannot map it.
  std::string DescribeMemory(const Region& region, const gpu::MemoryInfo& info) override {
    Reachable r;
    if (info.kind == gpu::MemoryKind::kDevice) {
      r.ipc = gpu::ExportIpc(info);
      r.ipc_offset = region.addr - info.alloc_base;
    } else {
      r.memfd = region.memfd;
    }
    return Encode(r);
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    auto d = segment->descriptor();
    auto ep = std::make_shared<CudaIpcEndpoint>(ctx_.copy_pool, *ctx_.copier, reaper_,
                                                segment->name(), d->pid, kName);
    ep->Follow(*d);
    return std::shared_ptr<Endpoint>(std::move(ep));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
  // Shared with the imports, which may outlive the transport (see Adopt).
  const std::shared_ptr<ThreadPool> reaper_ =
      ctx_.copier != nullptr ? std::make_shared<ThreadPool>(1, "ferry-ipc-reap") : nullptr;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(CudaIpcTransport);

}  // namespace ferry
