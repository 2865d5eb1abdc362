// The shm transport, for peers on the same host (same boot id and PID
// namespace). Engine-allocated memfd buffers are mapped once, by opening the
// peer's /proc/<pid>/fd/<n>, and copied with memcpy. Other registered memory is
// moved with process_vm_readv/writev. Copies run on the engine's copy pool.
// The peer's liveness is watched through a pidfd, so a dead peer fails
// requests with ConnectionLost instead of touching a reused pid.
//
// A region's blob is the owner's fd number of its memfd (an i32), or empty
// for memory that process_vm reaches.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "common/bytes.h"
#include "common/host.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "transfer/copy_task.h"
#include "transfer/memory_registry.h"
#include "transfer/peer_memfd.h"
#include "transfer/segment.h"
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

class ShmEndpoint : public Endpoint, public std::enable_shared_from_this<ShmEndpoint> {
 public:
  ShmEndpoint(ThreadPool& pool, std::shared_ptr<const SegmentDescriptor> desc,
              std::weak_ptr<Segment> segment, std::string name, const char* transport)
      : pool_(pool),
        desc_(std::move(desc)),
        segment_(std::move(segment)),
        name_(std::move(name)),
        transport_(transport) {
    pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(desc_->pid), 0));
  }

  ~ShmEndpoint() override {
    for (auto& [addr, m] : maps_) munmap(m.base, m.length);
    if (pidfd_ >= 0) close(pidfd_);
  }

  void Post(std::vector<Task> tasks) override {
    for (auto& t : tasks) {
      pool_.Post([self = shared_from_this(), t = std::move(t)] { t.Done(self->Run(t)); });
    }
  }

  void Close() override { closed_.store(true, std::memory_order_release); }

  // Buffers are mapped on first use from the descriptor the endpoint was made
  // with; a fresh endpoint maps from the fresh one.
  bool Follow(const SegmentDescriptor&) override { return false; }

 private:
  struct Mapping {
    char* base = nullptr;
    uint64_t length = 0;
  };

  Status Run(const Task& t) {
    FERRY_RETURN_IF_ERROR(CheckRunnable(t, closed_.load(std::memory_order_acquire)));
    if (PeerGone()) {
      if (auto seg = segment_.lock()) seg->MarkStale();
      return Status::ConnectionLost(name_ + " (pid " + std::to_string(desc_->pid) + ") has exited");
    }
    const RegionDesc* r = desc_->Find(t.remote, t.length);
    if (r == nullptr) {
      return Status::OutOfRange(
          fmt::format("0x{:x}+{} is not registered at {}", t.remote, t.length, name_));
    }
    if (const int32_t memfd = DecodeMemfd(desc_->BlobOf(*r, transport_)); memfd >= 0) {
      auto base = Map(*r, memfd);
      if (!base.ok()) return base.status();
      CopyTask(t, base.value() + (t.remote - r->addr));
      return Status::Ok();
    }
    return CrossProcess(t);
  }

  bool PeerGone() const {
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      return poll(&p, 1, 0) > 0;
    }
    return kill(static_cast<pid_t>(desc_->pid), 0) != 0 && errno == ESRCH;
  }

  Result<char*> Map(const RegionDesc& r, int32_t memfd) {
    std::lock_guard lk(mu_);
    auto it = maps_.find(r.addr);
    if (it != maps_.end()) return it->second.base;
    FERRY_ASSIGN_OR_RETURN(char* p, MapPeerMemfd(desc_->pid, memfd, r.length));
    maps_[r.addr] = {p, r.length};
    return p;
  }

  Status CrossProcess(const Task& t) {
    uint64_t done = 0;
    while (done < t.length) {
      iovec local{t.local + done, t.length - done};
      iovec remote{reinterpret_cast<void*>(t.remote + done), t.length - done};
      pid_t pid = static_cast<pid_t>(desc_->pid);
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
  const std::shared_ptr<const SegmentDescriptor> desc_;
  const std::weak_ptr<Segment> segment_;
  const std::string name_;
  const char* const transport_;  // our registered name: whose blobs to read
  int pidfd_ = -1;
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::map<uint64_t, Mapping> maps_;  // by remote region address; guarded by mu_
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

  // process_vm_readv/writev from same-host peers needs ptrace permission
  // under Yama.
  Status Offer() override {
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    return Status::Ok();
  }

  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return d && d->Offers(kName) && d->host_id == HostIdentity();
  }

  // Engine-allocated memory is mapped by its memfd; the rest needs nothing.
  std::string DescribeMemory(const Region& region, const gpu::MemoryInfo&) override {
    return region.memfd >= 0 ? EncodeMemfd(region.memfd) : std::string();
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    return std::shared_ptr<Endpoint>(std::make_shared<ShmEndpoint>(
        ctx_.copy_pool, segment->descriptor(), segment, segment->name(), kName));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(ShmTransport);

}  // namespace ferry
