// The shm transport, for peers on the same host (same boot id and PID
// namespace). Engine-allocated memfd buffers are mapped once and copied with
// memcpy; their owner hands out the fds over a Unix socket (peer_memfd.h,
// memfd_server.h), which needs no ptrace rights over it. Other registered
// memory is moved with process_vm_readv/writev, but only where the kernel
// already lets this process trace the owner (same uid, the owner dumpable,
// Yama permitting): Ferry never widens that. A peer that this transport
// cannot reach whole that way (another uid, a hardened owner with memory that
// is not memfd) goes to the next transport, tcp, with a log line. Copies run
// on the engine's copy pool. The peer's liveness is watched through a pidfd,
// so a dead peer fails requests with ConnectionLost instead of touching a
// reused pid.
//
// The segment's blob names the owner's memfd server (EncodeMemfdServer). A
// region's blob is the owner's fd number of its memfd (an i32), or empty for
// other memory.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>

#include "common/bytes.h"
#include "common/host.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "ferry/engine.h"
#include "transfer/copy_task.h"
#include "transfer/memory_registry.h"
#include "transfer/peer_memfd.h"
#include "transfer/segment.h"
#include "transfer/shm/memfd_server.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

std::string EncodeMemfd(int32_t fd) {
  std::vector<uint8_t> out;
  ByteWriter(&out).I32(fd);
  return std::string(out.begin(), out.end());
}

// The memfd a blob names, or -1.
int32_t DecodeMemfd(std::string_view blob) {
  if (blob.size() != 4) return -1;
  ByteReader r(reinterpret_cast<const uint8_t*>(blob.data()), blob.size());
  const int32_t fd = static_cast<int32_t>(r.U32());
  return fd >= 0 ? fd : -1;
}

// How this process reaches one peer's memory, as its descriptor offers it.
struct Access {
  bool fds = false;         // its memfd server hands us its memfds
  bool process_vm = false;  // the kernel lets us process_vm_readv/writev it
  bool reach = false;       // every host buffer one of those ways
};

// Whether the kernel lets this process read `pid`'s memory. The permission
// check comes first, so a one-byte read at address 0 fails with EFAULT once
// it passed, and with EPERM where it did not; no byte of the peer is read.
bool ProcessVmAllowed(uint32_t pid) {
  char byte;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  return process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) >= 0 ||
         errno == EFAULT;
}

// `*why` says what is missing when the result cannot reach `d` whole.
Access Assess(const SegmentDescriptor& d, std::string_view transport, std::string* why) {
  Access a;
  a.fds = MayAskForMemfds(d);
  a.process_vm = ProcessVmAllowed(d.pid);
  a.reach = a.process_vm || a.fds;
  if (a.process_vm) return a;
  const char* closed = "the kernel does not let this process read its memory (process_vm)";
  if (!a.fds) {
    *why = fmt::format("it shares no memfds with uid {}, and {}", geteuid(), closed);
    return a;
  }
  for (const RegionDesc& r : d.regions) {
    if (r.kind == static_cast<uint8_t>(gpu::MemoryKind::kDevice)) continue;  // not ours to move
    if (DecodeMemfd(d.BlobOf(r, transport)) < 0) {
      *why = fmt::format("its buffer at 0x{:x} is not engine-allocated (memfd), and {}", r.addr,
                         closed);
      a.reach = false;
      return a;
    }
  }
  return a;
}

class ShmEndpoint : public Endpoint, public std::enable_shared_from_this<ShmEndpoint> {
 public:
  ShmEndpoint(ThreadPool& pool, std::shared_ptr<const SegmentDescriptor> desc,
              std::weak_ptr<Segment> segment, std::string name, const char* transport,
              Access access, Millis timeout)
      : pool_(pool),
        segment_(std::move(segment)),
        name_(std::move(name)),
        transport_(transport),
        access_(access),
        timeout_(timeout),
        desc_(std::move(desc)) {
    pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(desc_->pid), 0));
  }

  ~ShmEndpoint() override {
    if (pidfd_ >= 0) close(pidfd_);
  }

  void Post(std::vector<Task> tasks) override {
    for (auto& t : tasks) {
      pool_.Post([self = shared_from_this(), t = std::move(t)] { t.Done(self->Run(t)); });
    }
  }

  void Close() override { closed_.store(true, std::memory_order_release); }

  // Maps every memfd buffer of the descriptor now, so no request pays for
  // the mapping (and its page-table fill, several milliseconds per 64 MiB on
  // a VM). Best effort: a buffer that cannot be mapped now is tried again
  // by its first request, which reports why.
  void Warm() override {
    if (!access_.fds) return;
    const auto desc = Descriptor();
    for (const RegionDesc& r : desc->regions) {
      if (const int32_t memfd = DecodeMemfd(desc->BlobOf(r, transport_)); memfd >= 0) {
        (void)Map(*desc, r, memfd);
      }
    }
  }

  // Follows registrations of the same process, mapping new buffers before
  // any request sees them: the watch calls this when the owner's generation
  // moves. Mappings of buffers gone from `fresh` are released once the
  // copies through them are done. A change in how the owner may be reached
  // drops the endpoint instead.
  bool Follow(const SegmentDescriptor& fresh) override {
    std::string why;
    const Access a = Assess(fresh, transport_, &why);
    if (a.fds != access_.fds || a.process_vm != access_.process_vm || !a.reach) return false;
    auto next = std::make_shared<const SegmentDescriptor>(fresh);
    {
      std::lock_guard lk(mu_);
      if (desc_->epoch != fresh.epoch) return false;
      desc_ = next;
      std::erase_if(maps_, [&](const auto& m) {
        const RegionDesc* r = fresh.Find(m.first, 1);
        return r == nullptr || r->addr != m.first || r->serial != m.second->serial;
      });
    }
    Warm();
    return true;
  }

 private:
  // A peer's memfd, mapped; unmapped when the last copy through it is done.
  struct Mapping {
    char* base = nullptr;
    uint64_t length = 0;
    uint64_t serial = 0;
    ~Mapping() { munmap(base, length); }
  };

  std::shared_ptr<const SegmentDescriptor> Descriptor() const {
    std::lock_guard lk(mu_);
    return desc_;
  }

  Status Run(const Task& t) {
    FERRY_RETURN_IF_ERROR(CheckRunnable(t, closed_.load(std::memory_order_acquire)));
    const auto desc = Descriptor();
    if (PeerGone(*desc)) {
      if (auto seg = segment_.lock()) seg->MarkStale();
      return Status::ConnectionLost(name_ + " (pid " + std::to_string(desc->pid) + ") has exited");
    }
    const RegionDesc* r = desc->Find(t.remote, t.length);
    if (r == nullptr) {
      return Status::OutOfRange(
          fmt::format("0x{:x}+{} is not registered at {}", t.remote, t.length, name_));
    }
    if (const int32_t memfd = DecodeMemfd(desc->BlobOf(*r, transport_));
        memfd >= 0 && access_.fds) {
      auto m = Map(*desc, *r, memfd);
      if (m.ok()) {
        CopyTask(t, m.value()->base + (t.remote - r->addr));
        return Status::Ok();
      }
      if (m.status().code() == StatusCode::kNotFound) {
        if (auto seg = segment_.lock()) seg->MarkStale();  // freed since: refetch
        return m.status();
      }
      if (!access_.process_vm) return m.status();
      // Otherwise the same bytes go through process_vm.
    }
    if (!access_.process_vm) {
      // CanReach said otherwise of the descriptor this endpoint was made from.
      return Status::Unavailable(fmt::format("0x{:x}+{} at {} is not memfd memory that shm can map",
                                             t.remote, t.length, name_));
    }
    return CrossProcess(t, desc->pid);
  }

  bool PeerGone(const SegmentDescriptor& d) const {
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      return poll(&p, 1, 0) > 0;
    }
    return kill(static_cast<pid_t>(d.pid), 0) != 0 && errno == ESRCH;
  }

  // The mapping of region `r` of `desc`, made on first use. It is made
  // outside the lock, so requests to buffers already mapped never wait for
  // it; of two made at once, one is kept.
  Result<std::shared_ptr<const Mapping>> Map(const SegmentDescriptor& desc, const RegionDesc& r,
                                             int32_t memfd) {
    {
      std::lock_guard lk(mu_);
      auto it = maps_.find(r.addr);
      if (it != maps_.end() && it->second->serial == r.serial) return it->second;
    }
    FERRY_ASSIGN_OR_RETURN(char* p,
                           MapPeerMemfd(desc, {memfd, r.addr, r.serial, r.length}, timeout_));
    auto m = std::make_shared<Mapping>();
    m->base = p;
    m->length = r.length;
    m->serial = r.serial;
    std::lock_guard lk(mu_);
    auto it = maps_.find(r.addr);
    if (it != maps_.end() && it->second->serial == r.serial) return it->second;
    // Only a buffer the current descriptor still lists is kept for later.
    if (const RegionDesc* now = desc_->Find(r.addr, 1);
        now != nullptr && now->addr == r.addr && now->serial == r.serial) {
      maps_[r.addr] = m;
    }
    return std::shared_ptr<const Mapping>(std::move(m));
  }

  Status CrossProcess(const Task& t, uint32_t owner_pid) {
    uint64_t done = 0;
    while (done < t.length) {
      iovec local{t.local + done, t.length - done};
      iovec remote{reinterpret_cast<void*>(t.remote + done), t.length - done};
      pid_t pid = static_cast<pid_t>(owner_pid);
      ssize_t n = t.op == Op::kWrite ? process_vm_writev(pid, &local, 1, &remote, 1, 0)
                                     : process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ESRCH) return Status::ConnectionLost(name_ + " has exited");
        if (errno == EFAULT) {
          return Status::OutOfRange(
              fmt::format("0x{:x}+{} is not mapped at {}", t.remote, t.length, name_));
        }
        return Status::FromErrno(errno,
                                 t.op == Op::kWrite ? "process_vm_writev" : "process_vm_readv");
      }
      if (n == 0) return Status::IoError("process_vm copy made no progress");
      done += static_cast<uint64_t>(n);
    }
    return Status::Ok();
  }

  ThreadPool& pool_;
  const std::weak_ptr<Segment> segment_;
  const std::string name_;
  const char* const transport_;  // our registered name: whose blobs to read
  const Access access_;
  const Millis timeout_;  // for each memfd request
  mutable std::mutex mu_;
  std::shared_ptr<const SegmentDescriptor> desc_;  // guarded by mu_; same epoch throughout
  int pidfd_ = -1;
  std::atomic<bool> closed_{false};
  // By remote region address; guarded by mu_.
  std::map<uint64_t, std::shared_ptr<const Mapping>> maps_;
};

class ShmTransport : public Transport {
 public:
  static constexpr char kName[] = "shm";

  explicit ShmTransport(EngineContext& ctx) : ctx_(ctx) {
    caps_.name = kName;
    caps_.priority = 20;
    caps_.max_task_bytes = 8ull << 20;
    caps_.reach = Reach::kHost;
  }

  const TransportCaps& caps() const override { return caps_; }

  // Serves this engine's memfds to same-host peers. Without the socket,
  // peers reach this process only where the kernel lets them trace it.
  Status Offer() override {
    auto server = MemfdServer::Start(ctx_.registry, ctx_.options.connect_timeout);
    if (server.ok()) {
      server_ = std::move(server).value();
    } else {
      FERRY_LOG_WARN("shm: {}; same-host peers map no memfd of this engine",
                     server.status().ToString());
    }
    return Status::Ok();
  }

  std::string DescribeSegment() override { return server_ ? server_->blob() : std::string(); }

  // Besides the descriptor, asks the kernel once per descriptor whether
  // process_vm may read the peer.
  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return d && d->Offers(kName) && d->host_id == HostIdentity() && AccessTo(segment, d).reach;
  }

  // Engine-allocated memory is mapped by its memfd; the rest needs nothing.
  std::string DescribeMemory(const Region& region, const gpu::MemoryInfo&) override {
    return region.memfd >= 0 ? EncodeMemfd(region.memfd) : std::string();
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    auto d = segment->descriptor();
    return std::shared_ptr<Endpoint>(
        std::make_shared<ShmEndpoint>(ctx_.copy_pool, d, segment, segment->name(), kName,
                                      AccessTo(*segment, d), ctx_.options.connect_timeout));
  }

 private:
  // Assessed once per descriptor: a submit costs one lookup. The first time
  // a peer's process cannot be reached whole, says so and why.
  Access AccessTo(const Segment& segment, const std::shared_ptr<const SegmentDescriptor>& d) const {
    {
      std::shared_lock lk(mu_);
      auto it = verdicts_.find(d.get());
      if (it != verdicts_.end() && it->second.of.lock() == d) return it->second.access;
    }
    std::string why;
    const Access a = Assess(*d, kName, &why);
    std::lock_guard lk(mu_);
    std::erase_if(verdicts_, [](const auto& v) { return v.second.of.expired(); });
    verdicts_[d.get()] = {d, a};
    if (!a.reach) {
      if (told_.size() >= 1024) told_.clear();
      if (told_.insert(d->epoch).second) {
        FERRY_LOG_WARN("shm: {} (pid {}) is reached over another transport: {}", segment.name(),
                       d->pid, why);
      }
    }
    return a;
  }

  struct Verdict {
    std::weak_ptr<const SegmentDescriptor> of;
    Access access;
  };

  EngineContext& ctx_;
  TransportCaps caps_;
  std::unique_ptr<MemfdServer> server_;  // null when its socket could not be made
  mutable std::shared_mutex mu_;
  mutable std::map<const SegmentDescriptor*, Verdict> verdicts_;  // guarded by mu_
  mutable std::set<uint64_t> told_;  // epochs logged as unreachable; guarded by mu_
};

}  // namespace

FERRY_REGISTER_TRANSPORT(ShmTransport);

}  // namespace ferry
