#include "ferry/engine.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/env.h"
#include "common/host.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/thread_pool.h"
#include "common/ticker.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/batch.h"
#include "transfer/listener.h"
#include "transfer/memory_registry.h"
#include "transfer/metadata.h"
#include "transfer/segment.h"
#include "transfer/stream_relay.h"
#include "transfer/transport.h"

namespace ferry {

std::string_view TransportName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kNone:
      return "none";
    case TransportKind::kLocal:
      return "local";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kCudaIpc:
      return "cuda_ipc";
  }
  return "unknown";
}

// ---- transport registry ----

namespace {
std::vector<TransportRegistration>& Registry() {
  static std::vector<TransportRegistration> r;
  return r;
}
}  // namespace

bool RegisterTransport(const char* name, TransportFactory factory) {
  Registry().push_back({name, factory});
  return true;
}

std::vector<TransportRegistration> RegisteredTransports() { return Registry(); }

// ---- Batch ----

Batch::Batch(std::shared_ptr<BatchState> state) : state_(std::move(state)) {}

Batch::~Batch() {
  state_->Cancel();
  // Bounded: every held task has a deadline that its transport enforces.
  Deadline limit(state_->latest_deadline().at() + std::chrono::seconds(5));
  if (!state_->WaitQuiescent(limit)) {
    FERRY_LOG_ERROR("batch freed while a transport still held its tasks past their deadline");
  }
}

size_t Batch::size() const { return state_->size(); }
BatchStatus Batch::Poll() const { return state_->Poll(); }
RequestResult Batch::Result(size_t index) const { return state_->Result(index); }

Status Batch::Wait(std::chrono::milliseconds timeout) {
  if (!state_->WaitDone(Deadline::After(timeout))) {
    return Status(StatusCode::kTimeout,
                  "batch not done within " + std::to_string(timeout.count()) + " ms");
  }
  return state_->Poll().first_error;
}

// ---- Engine ----

class Engine::Impl {
 public:
  explicit Impl(EngineOptions o) : options_(std::move(o)) {}

  ~Impl() {
    if (watch_) watch_->Stop();  // its job reaches it through watch_
    watch_.reset();
    if (listener_) listener_->Stop();
    std::vector<std::shared_ptr<Endpoint>> eps;
    {
      std::lock_guard lk(segments_mu_);
      for (auto& [id, seg] : segments_) {
        std::lock_guard elk(seg->endpoints_mu);
        for (auto& [t, ep] : seg->endpoints) eps.push_back(ep);
        seg->endpoints.clear();
      }
      segments_.clear();
    }
    for (auto& ep : eps) ep->Close();
    eps.clear();
    relay_.reset();  // releases any stream still waiting on it
    transports_.clear();
    // Let the io threads run the close handlers, then stop them.
    work_.reset();
    Deadline idle = Deadline::After(std::chrono::seconds(2));
    while (!io_.stopped() && !idle.Expired()) std::this_thread::sleep_for(Millis(1));
    io_.stop();
    for (auto& t : io_threads_) t.join();
    landing_pool_.reset();  // its jobs use the listener's staging
    listener_.reset();
    copy_pool_.reset();
    copier_.reset();  // after the copy threads, which enqueue on it
    for (const Region& r : registry_.Snapshot()) {
      if (r.owned) ReleaseOwned(r);
    }
    if (generation_ != nullptr) munmap(generation_, kGenerationPageBytes);
    if (generation_fd_ >= 0) close(generation_fd_);
  }

  Status Init() {
    ApplyEnv();
    if (options_.metadata != "p2p") {
      return Status(StatusCode::kNotSupported,
                    "metadata '" + options_.metadata + "' is not supported; use p2p");
    }
    if (!options_.transport.empty() && options_.transport != "tcp" && options_.transport != "shm") {
      return Status(StatusCode::kInvalidArgument,
                    "transport must be tcp, shm or empty, not '" + options_.transport + "'");
    }
    if (options_.tcp_lanes < 1 || options_.tcp_chunks_in_flight < 1 ||
        options_.tcp_chunk_bytes < 4096 || options_.tcp_chunk_bytes > (64u << 20)) {
      return Status(StatusCode::kInvalidArgument, "tcp options out of range");
    }
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                        static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    do {
      epoch_ = gen();
    } while (epoch_ == 0);
    // process_vm_readv from same-host peers needs ptrace permission under Yama.
    if (options_.transport != "tcp") prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

    has_gpu_ = gpu::DeviceCount() > 0;
    FERRY_LOG_INFO("engine: {}", gpu::Describe());
    if (has_gpu_) {
      auto copier = gpu::Copier::Create();
      if (!copier.ok()) return copier.status();
      copier_ = std::move(copier).value();
      // Four stream-ordered batches in flight at once, eight chunks each per window.
      relay_ = StreamRelay::Create(copier_.get(), 4, 8 * options_.tcp_chunk_bytes,
                                   options_.request_timeout);
    }
    FERRY_RETURN_IF_ERROR(MakeGenerationPage());
    copy_pool_ = std::make_unique<ThreadPool>(options_.copy_threads, "ferry-copy");
    const int landing = options_.landing_threads < 0
                            ? OnePerFourCores(2, std::max(2, options_.tcp_lanes))
                            : options_.landing_threads;
    if (has_gpu_ && landing > 0) {
      landing_pool_ = std::make_unique<ThreadPool>(landing, "ferry-landing");
    }
    Listener::Config cfg;
    cfg.host = options_.host;
    cfg.port = options_.port;
    cfg.epoch = epoch_;
    cfg.frame_timeout = options_.request_timeout;
    cfg.max_connections = static_cast<size_t>(env::GetInt("FERRY_MAX_CONNECTIONS", 1024));
    cfg.staging_bytes = options_.tcp_chunk_bytes;
    // One peer's lanes, each with the doubled window of requests to GPU memory
    // as far as a connection can use it; 16 at least, 64 at most.
    const size_t per_lane = std::min<size_t>(2 * static_cast<size_t>(options_.tcp_chunks_in_flight),
                                             Listener::kMaxQueuedReplies);
    cfg.staging_buffers =
        std::clamp<size_t>(static_cast<size_t>(options_.tcp_lanes) * per_lane, 16, 64);
    cfg.landing = landing_pool_.get();
    auto l = Listener::Start(io_, cfg, registry_, copier_.get(),
                             [this] { return EncodeDescriptor(Describe()); });
    if (!l.ok()) return l.status();
    listener_ = std::move(l).value();
    name_ =
        (options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host) +
        ":" + std::to_string(listener_->port());

    ctx_ = std::make_unique<EngineContext>(
        EngineContext{options_, io_, *copy_pool_, registry_, copier_.get(), landing_pool_.get()});
    for (const auto& reg : RegisteredTransports()) transports_.push_back(reg.factory(*ctx_));
    std::sort(transports_.begin(), transports_.end(),
              [](const auto& a, const auto& b) { return a->caps().priority < b->caps().priority; });
    const int io_threads =
        options_.io_threads <= 0 ? OnePerFourCores(1, options_.tcp_lanes) : options_.io_threads;
    for (int i = 0; i < io_threads; ++i) {
      io_threads_.emplace_back([this] {
        NameThisThread("ferry-io");
        io_.run();
      });
    }
    // With or without a GPU, so hosts without one run the same refresh path.
    watch_ =
        std::make_unique<Ticker>("ferry-watch", kWatchPeriod, [this](bool woken) { Watch(woken); });
    watch_->Start();
    return Status::Ok();
  }

  const std::string& name() const { return name_; }
  uint64_t epoch() const { return epoch_; }
  Millis request_timeout() const { return options_.request_timeout; }

  SegmentDescriptor Describe() const {
    SegmentDescriptor d;
    d.epoch = epoch_;
    d.host_id = HostIdentity();
    d.pid = static_cast<uint32_t>(getpid());
    // Read before the regions: a removal in between only costs peers a refresh.
    d.generation = __atomic_load_n(generation_, __ATOMIC_ACQUIRE);
    d.control_memfd = generation_fd_;
    d.transports = {"tcp"};
    if (options_.transport != "tcp") d.transports.push_back("shm");
    if (copier_ && options_.transport != "tcp") d.transports.push_back("cuda_ipc");
    for (const Region& r : registry_.Snapshot()) {
      d.regions.push_back({r.addr, r.length, r.memfd, static_cast<uint8_t>(r.kind), r.device, r.ipc,
                           r.ipc_offset, r.serial});
    }
    return d;
  }

  Status RegisterMemory(void* addr, size_t length) {
    Region r;
    r.addr = reinterpret_cast<uint64_t>(addr);
    r.length = length;
    if (has_gpu_) {
      gpu::MemoryInfo info = gpu::Classify(addr);
      r.kind = info.kind;
      r.device = info.device;
      if (info.kind == gpu::MemoryKind::kDevice) {
        r.ipc = gpu::ExportIpc(info);  // empty: same-host peers cannot map it
        r.ipc_offset = r.addr - info.alloc_base;
      }
    }
    r.serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
    FERRY_RETURN_IF_ERROR(registry_.Add(r));
    BumpGeneration();
    return Status::Ok();
  }

  Status UnregisterMemory(void* addr) {
    auto r = registry_.Remove(reinterpret_cast<uint64_t>(addr), false);
    if (!r.ok()) return r.status();
    BumpGeneration();
    return Status::Ok();
  }

  Result<void*> AllocateMemory(size_t length) {
    if (length == 0) return Status(StatusCode::kInvalidArgument, "allocation of zero bytes");
    int fd = memfd_create("ferry-segment", MFD_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "memfd_create");
    if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
      int err = errno;
      close(fd);
      return Status::FromErrno(err, "ftruncate");
    }
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      close(fd);
      return Status::FromErrno(err, "mmap");
    }
    Region r;
    r.addr = reinterpret_cast<uint64_t>(p);
    r.length = length;
    r.memfd = fd;
    r.owned = true;
    if (has_gpu_ && gpu::PinHost(p, length)) {
      r.pinned = true;
      r.kind = gpu::MemoryKind::kHostPinned;
    }
    r.serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
    Status st = registry_.Add(r);
    if (!st.ok()) {
      ReleaseOwned(r);
      return st;
    }
    BumpGeneration();
    return p;
  }

  Status FreeMemory(void* addr) {
    auto r = registry_.Remove(reinterpret_cast<uint64_t>(addr), true);
    if (!r.ok()) return r.status();
    BumpGeneration();
    ReleaseOwned(r.value());
    return Status::Ok();
  }

  Result<SegmentId> OpenSegment(std::string_view name) {
    FERRY_ASSIGN_OR_RETURN(SegmentAddress addr, ParseSegmentName(name));
    bool self = name == name_;
    std::shared_ptr<const SegmentDescriptor> desc;
    if (self) {
      desc = std::make_shared<SegmentDescriptor>(Describe());
    } else {
      FERRY_ASSIGN_OR_RETURN(SegmentDescriptor d, FetchDescriptor(addr, options_.connect_timeout));
      desc = std::make_shared<SegmentDescriptor>(std::move(d));
    }
    std::shared_ptr<Segment> seg;
    SegmentId id;
    {
      std::lock_guard lk(segments_mu_);
      id = next_segment_++;
      seg = std::make_shared<Segment>(id, std::string(name), addr.host, addr.port, self);
      seg->WatchGeneration(*desc, HostIdentity());
      seg->set_descriptor(std::move(desc));
      segments_[id] = seg;
    }
    // The watch idles while it has no peer to follow: wake it to take this one.
    if (seg->Watched()) watch_->Wake();
    PreConnectGpu(seg);
    return id;
  }

  std::shared_ptr<Segment> FindSegment(SegmentId id) {
    std::lock_guard lk(segments_mu_);
    auto it = segments_.find(id);
    return it == segments_.end() ? nullptr : it->second;
  }

  // Refetches the descriptor. On an epoch change the endpoints are dropped, so
  // mappings and connections of the old process are never reused. On a
  // registration change they follow it before requests see it. One at a time
  // per segment, and never backwards: a fetch older than what is held is ignored.
  Status Refresh(Segment& seg) {
    std::lock_guard refreshing(seg.refresh_mu);
    std::shared_ptr<const SegmentDescriptor> fresh;
    if (seg.is_self()) {
      fresh = std::make_shared<SegmentDescriptor>(Describe());
    } else {
      auto d = FetchDescriptor({seg.host(), seg.port()}, options_.connect_timeout);
      if (!d.ok()) {
        seg.MarkStale();  // try again next time
        return d.status();
      }
      fresh = std::make_shared<SegmentDescriptor>(std::move(d).value());
    }
    auto old = seg.descriptor();
    const bool restarted = old && old->epoch != fresh->epoch;
    if (old && !restarted && fresh->generation < old->generation) return Status::Ok();
    const bool changed = old && !restarted && !SameRegions(*old, *fresh);
    if (changed) Follow(seg, *fresh);
    seg.WatchGeneration(*fresh, HostIdentity());
    seg.set_descriptor(fresh);
    // Again, for any endpoint made meanwhile from the old descriptor; a no-op
    // for the others.
    if (changed) Follow(seg, *fresh);
    if (restarted) {
      FERRY_LOG_WARN("segment {} restarted (epoch {:x} -> {:x}); cache refreshed", seg.name(),
                     old->epoch, fresh->epoch);
      std::vector<std::shared_ptr<Endpoint>> eps;
      {
        std::lock_guard lk(seg.endpoints_mu);
        for (auto& [t, ep] : seg.endpoints) eps.push_back(ep);
        seg.endpoints.clear();
      }
      for (auto& ep : eps) ep->Close();
    }
    return Status::Ok();
  }

  // Thread counts that grow with the machine.
  static int OnePerFourCores(int lo, int hi) {
    return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, lo, hi);
  }

  // By registration, not generation: the owner reads its generation before
  // its regions, so two descriptors of one generation can differ.
  static bool SameRegions(const SegmentDescriptor& a, const SegmentDescriptor& b) {
    return std::equal(a.regions.begin(), a.regions.end(), b.regions.begin(), b.regions.end(),
                      [](const RegionDesc& x, const RegionDesc& y) {
                        return x.addr == y.addr && x.serial == y.serial;
                      });
  }

  // The data path's refresh, before a submit. A same-host peer the watch
  // follows changes registrations through the watch alone, since following
  // may import and page-lock (R4): the submit wakes it and waits, up to
  // connect_timeout. A peer that restarted, or that the watch could not
  // refetch, is refetched here.
  Status RefreshIfChanged(Segment& seg) {
    if (seg.TakeStale()) return Refresh(seg);
    if (!seg.Outdated()) return Status::Ok();
    if (!seg.Watched()) return Refresh(seg);
    const Deadline deadline = Deadline::After(options_.connect_timeout);
    // A round that starts after this one has seen the change: a peer that
    // keeps registering cannot hold the submit past it.
    const uint64_t round = watch_->runs();
    while (seg.Outdated() && watch_->runs() < round + 2) {
      watch_->Wake();
      if (seg.TakeStale()) return Refresh(seg);  // the watch's refetch failed
      if (deadline.Expired()) {
        return Status(StatusCode::kTimeout,
                      "registration change at " + seg.name() + " not followed in time");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return Status::Ok();
  }

  // Endpoints that cannot follow a registration change are dropped; work in
  // flight keeps them, and their mappings, until done.
  static void Follow(Segment& seg, const SegmentDescriptor& fresh) {
    std::vector<std::pair<const Transport*, std::shared_ptr<Endpoint>>> eps;
    {
      std::lock_guard lk(seg.endpoints_mu);
      eps.assign(seg.endpoints.begin(), seg.endpoints.end());
    }
    for (auto& [t, ep] : eps) {
      if (ep->Follow(fresh)) continue;
      std::lock_guard lk(seg.endpoints_mu);
      auto it = seg.endpoints.find(t);
      if (it != seg.endpoints.end() && it->second == ep) seg.endpoints.erase(it);
    }
  }

  // Follows same-host peers' registration changes off the data path, so the
  // imports and page-locked mappings a change needs (R4) are made here within
  // about kWatchPeriod, or at once when a submit waits for it.
  // A peer that cannot be refetched (it died after a change) is tried again
  // after kWatchBackoff, not every period, unless a submit waits. With no
  // peer to follow it looks every kWatchIdle, so an idle engine stays asleep.
  void Watch(bool waited_for) {
    std::vector<std::shared_ptr<Segment>> segs;
    {
      std::lock_guard lk(segments_mu_);
      for (auto& [id, seg] : segments_) {
        if (!seg->is_self()) segs.push_back(seg);
      }
    }
    const bool any = std::any_of(segs.begin(), segs.end(), [](auto& s) { return s->Watched(); });
    watch_->SetPeriod(any ? kWatchPeriod : kWatchIdle);
    std::erase_if(retry_at_, [&](const auto& e) {
      return std::none_of(segs.begin(), segs.end(),
                          [&](const auto& seg) { return seg->id() == e.first; });
    });
    for (auto& seg : segs) {
      if (!seg->Outdated()) continue;
      auto it = retry_at_.find(seg->id());
      if (it != retry_at_.end() && Clock::now() < it->second && !waited_for) continue;
      if (Refresh(*seg).ok()) {  // a failure also marks it stale, for the next submit
        retry_at_.erase(seg->id());
      } else {
        retry_at_[seg->id()] = Clock::now() + kWatchBackoff;
      }
    }
  }

  Result<SegmentInfo> GetSegmentInfo(SegmentId id) {
    auto seg = FindSegment(id);
    if (!seg) return Status(StatusCode::kNotFound, "unknown segment " + std::to_string(id));
    if (seg->TakeStale()) FERRY_RETURN_IF_ERROR(Refresh(*seg));
    auto d = seg->descriptor();
    SegmentInfo info;
    info.name = seg->name();
    info.epoch = d->epoch;
    info.same_host = d->host_id == HostIdentity();
    for (const auto& r : d->regions) info.buffers.push_back({r.addr, r.length, r.memfd >= 0});
    return info;
  }

  Status CloseSegment(SegmentId id) {
    std::shared_ptr<Segment> seg;
    {
      std::lock_guard lk(segments_mu_);
      auto it = segments_.find(id);
      if (it == segments_.end()) {
        return Status(StatusCode::kNotFound, "unknown segment " + std::to_string(id));
      }
      seg = std::move(it->second);
      segments_.erase(it);
    }
    std::lock_guard lk(seg->endpoints_mu);
    for (auto& [t, ep] : seg->endpoints) ep->Close();
    seg->endpoints.clear();
    return Status::Ok();
  }

  // The endpoint of the first transport, in priority order, that may serve this
  // segment for host or GPU memory. Connect never blocks, so neither does this.
  Result<std::pair<Transport*, std::shared_ptr<Endpoint>>> Route(
      const std::shared_ptr<Segment>& seg, bool gpu) {
    std::lock_guard lk(seg->endpoints_mu);
    for (auto& t : transports_) {
      const TransportCaps& c = t->caps();
      if (!(gpu ? c.gpu_memory : c.host_memory)) continue;
      if (!Allowed(*t) || !t->CanReach(*seg)) continue;
      auto it = seg->endpoints.find(t.get());
      if (it != seg->endpoints.end()) return std::make_pair(t.get(), it->second);
      auto ep = t->Connect(seg);
      if (!ep.ok()) return ep.status();
      seg->endpoints[t.get()] = ep.value();
      return std::make_pair(t.get(), std::move(ep).value());
    }
    const std::string how = forced_.empty() ? "" : " with " + forced_;
    if (gpu) {
      return Status(StatusCode::kNotSupported,
                    "no transport moves GPU memory to segment " + seg->name() + how + " yet");
    }
    return Status(StatusCode::kUnavailable, "no transport can reach segment " + seg->name() + how);
  }

  // A forced transport applies to remote segments and to our own, so tests and
  // benchmarks can push loopback traffic through tcp or shm. It forces the
  // host-memory path only.
  bool Allowed(const Transport& t) const {
    if (forced_.empty()) return true;
    return forced_ == t.caps().name ||
           (t.caps().gpu_memory && !t.caps().host_memory && forced_ != "tcp");
  }

  // Maps what a segment's GPU memory needs (IPC handles, registered mappings)
  // when it is opened, so no data path opens or registers anything (R4).
  void PreConnectGpu(const std::shared_ptr<Segment>& seg) {
    if (!copier_) return;
    auto d = seg->descriptor();
    if (!d || seg->is_self()) return;
    auto r = Route(seg, true);
    if (!r.ok()) FERRY_LOG_DEBUG("no GPU path to {}: {}", seg->name(), r.status().ToString());
  }

  // The whole-batch checks shared by both submit paths; fills `segs`.
  Status Validate(std::span<const Request> reqs,
                  std::unordered_map<SegmentId, std::shared_ptr<Segment>>* segs) {
    if (reqs.empty()) return Status(StatusCode::kInvalidArgument, "empty batch");
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Request& r = reqs[i];
      auto bad = [i](StatusCode code, const std::string& why) {
        return Status(code, "request " + std::to_string(i) + ": " + why);
      };
      if (r.local == nullptr) return bad(StatusCode::kInvalidArgument, "null local address");
      if (r.length == 0) return bad(StatusCode::kInvalidArgument, "zero length");
      if (r.op != Op::kRead && r.op != Op::kWrite) {
        return bad(StatusCode::kInvalidArgument, "unknown op");
      }
      if (!segs->count(r.segment)) {
        auto seg = FindSegment(r.segment);
        if (!seg) {
          return bad(StatusCode::kNotFound, "unknown segment " + std::to_string(r.segment));
        }
        segs->emplace(r.segment, std::move(seg));
      }
    }
    return Status::Ok();
  }

  // R5. Copies that a mapping allows (cuda_ipc, local) go on the caller's
  // stream itself, with no wait. The rest is relayed: the CPU moves the bytes
  // (tcp, shm), between a signal and a wait on the stream that only CPU
  // progress releases, and GPU memory of this process is staged by copies on
  // the stream (stream_relay.h). Every request is resolved before anything is
  // enqueued (R7).
  Result<std::unique_ptr<Batch>> SubmitOnStream(std::span<const Request> reqs, void* stream) {
    if (!copier_) {
      return Status(StatusCode::kNotSupported,
                    "stream-ordered transfers need a GPU (" + gpu::Describe() + ")");
    }
    std::unordered_map<SegmentId, std::shared_ptr<Segment>> segs;
    FERRY_RETURN_IF_ERROR(Validate(reqs, &segs));
    FERRY_RETURN_IF_ERROR(copier_->CheckStream(stream));
    for (auto& [id, seg] : segs) {
      FERRY_RETURN_IF_ERROR(RefreshIfChanged(*seg));
    }
    struct Copy {
      void* dst;
      const void* src;
      size_t length;
    };
    std::vector<Copy> copies;
    std::vector<std::shared_ptr<const void>> holds;  // the copies' mappings, until done
    std::vector<size_t> copied;                      // request indices
    std::vector<size_t> relayed;                     // request indices
    std::set<SegmentId> refreshed;
    std::vector<StreamRelay::Chunk> chunks;
    auto state = std::make_shared<BatchState>(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Request& r = reqs[i];
      auto bad = [i](const Status& st) {
        return Status(st.code(), "request " + std::to_string(i) + ": " + st.message());
      };
      const std::shared_ptr<Segment>& seg = segs[r.segment];
      auto remote = CheckRemote(r, *seg, &refreshed);
      if (!remote.ok()) return bad(remote.status());
      const Sides sides = GpuSides(r, remote.value());
      auto route = Route(seg, sides.device() >= 0);
      if (!route.ok()) return bad(route.status());
      auto [transport, ep] = route.value();
      if (sides.device() >= 0) {
        auto mapped = ep->MapForStream(r.remote, r.length);
        TransportKind via = transport->caps().kind;
        if (!mapped.ok() && sides.remote >= 0 && InThisProcess(*seg)) {
          // GPU memory of another engine of this process: relaying would make
          // the stream's wait depend on that engine's GPU copy, which R5
          // forbids (it deadlocks under lazy loading). The address is ours:
          // copy on the caller's stream, whatever transport is forced.
          mapped = Endpoint::Mapped{reinterpret_cast<void*>(r.remote), nullptr};
          via = TransportKind::kLocal;
        }
        if (mapped.ok()) {
          const bool write = r.op == Op::kWrite;
          void* remote_addr = mapped.value().addr;
          copies.push_back(
              {write ? remote_addr : r.local, write ? r.local : remote_addr, r.length});
          if (mapped.value().hold) holds.push_back(std::move(mapped.value().hold));
          copied.push_back(i);
          state->Plan(i, 1, via);
          continue;
        }
      }
      if (!relay_) {
        return bad(Status(StatusCode::kNotSupported, "no staging for stream-ordered transfers"));
      }
      // Relayed: a host-memory path to the target, which stages its own GPU memory.
      if (sides.remote < 0) {
        auto host = Route(seg, false);
        if (!host.ok()) return bad(host.status());
        std::tie(transport, ep) = host.value();
      } else if (transport->caps().kind != TransportKind::kTcp) {
        return bad(Status(StatusCode::kNotSupported,
                          std::string("GPU memory at ") + seg->name() + " is not reachable by " +
                              transport->caps().name + " from a stream"));
      }
      uint64_t slice = std::min<uint64_t>(transport->caps().max_task_bytes, relay_->slot_bytes());
      for (uint64_t off = 0; off < r.length; off += slice) {
        chunks.push_back({ep, r.op, static_cast<char*>(r.local) + off, sides.local >= 0,
                          r.remote + off, std::min(slice, r.length - off), static_cast<uint32_t>(i),
                          sides.remote >= 0});
      }
      relayed.push_back(i);
      state->Plan(i, 1, transport->caps().kind);
    }
    state->NoteDeadline(Deadline::After(options_.request_timeout));
    Status failed;
    size_t enqueued = 0;
    for (const Copy& c : copies) {
      failed = copier_->EnqueueOnStream(stream, c.dst, c.src, c.length);
      if (!failed.ok()) break;
      ++enqueued;
    }
    if (enqueued > 0) {
      copier_->NotifyOnStream(
          stream, [state, copied, enqueued, holds = std::move(holds)](const Status& st) {
            for (size_t k = 0; k < enqueued; ++k) state->TaskDone(copied[k], st);
          });
    }
    for (size_t k = enqueued; k < copied.size(); ++k) state->TaskDone(copied[k], failed);
    if (!chunks.empty()) {
      if (failed.ok()) {
        failed = relay_->Submit(stream, std::move(chunks), state,
                                Deadline::After(options_.request_timeout));
      }
      if (!failed.ok()) {
        for (size_t i : relayed) state->TaskDone(i, failed);
      }
    }
    return std::make_unique<Batch>(std::move(state));
  }

  Result<std::unique_ptr<Batch>> Submit(std::span<const Request> reqs, const SubmitOptions& opts) {
    Millis timeout = opts.timeout.count() > 0 ? opts.timeout : options_.request_timeout;
    std::unordered_map<SegmentId, std::shared_ptr<Segment>> segs;
    FERRY_RETURN_IF_ERROR(Validate(reqs, &segs));
    auto state = std::make_shared<BatchState>(reqs.size());
    std::unordered_map<SegmentId, Status> stale_errors;
    std::set<SegmentId> refreshed;
    Deadline deadline = Deadline::After(timeout);
    state->NoteDeadline(deadline);

    // Route every request first, then plan every task, then post: a task that
    // completes early must never see its request's count unset.
    for (auto& [id, seg] : segs) {
      Status st = RefreshIfChanged(*seg);
      if (!st.ok()) stale_errors[id] = st;
    }
    struct Path {
      Status status;
      Transport* transport = nullptr;
      std::shared_ptr<Endpoint> ep;
    };
    std::map<std::pair<SegmentId, bool>, Path> routes;  // by segment and GPU-ness
    std::unordered_map<Endpoint*, std::vector<Task>> posts;
    std::vector<std::shared_ptr<Endpoint>> keep;
    std::shared_ptr<gpu::ReadyEvent> ready;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Request& r = reqs[i];
      const std::shared_ptr<Segment>& seg = segs[r.segment];
      if (auto it = stale_errors.find(r.segment); it != stale_errors.end()) {
        state->FailRequest(i, it->second);
        continue;
      }
      auto remote = CheckRemote(r, *seg, &refreshed);
      if (!remote.ok()) {
        const Status& st = remote.status();
        state->FailRequest(i,
                           Status(st.code(), "request " + std::to_string(i) + ": " + st.message()));
        continue;
      }
      const Sides sides = has_gpu_ ? GpuSides(r, remote.value()) : Sides{};
      const int gpu_device = sides.device();
      const bool gpu_local = sides.local >= 0;
      const bool gpu = gpu_device >= 0;
      auto [rit, fresh] = routes.try_emplace({r.segment, gpu});
      Path& rt = rit->second;
      if (fresh) {
        auto got = Route(seg, gpu);
        if (got.ok()) {
          rt.transport = got.value().first;
          rt.ep = got.value().second;
        } else {
          rt.status = got.status();
        }
      }
      if (!rt.status.ok()) {
        state->FailRequest(i, rt.status);
        continue;
      }
      if (gpu && !ready && !opts.already_ready) {
        // R1/R2: one event on the submission stream orders the whole batch.
        auto rec = copier_->RecordReady(opts.stream);
        if (!rec.ok()) return rec.status();  // nothing has been posted yet
        ready = std::move(rec).value();
      }
      const uint64_t slice = rt.transport->caps().max_task_bytes;
      uint32_t n = static_cast<uint32_t>((r.length + slice - 1) / slice);
      state->Plan(i, n, rt.transport->caps().kind);
      auto& v = posts[rt.ep.get()];
      if (v.empty()) keep.push_back(rt.ep);
      for (uint64_t off = 0; off < r.length; off += slice) {
        Task t;
        t.op = r.op;
        t.local = static_cast<char*>(r.local) + off;
        t.remote = r.remote + off;
        t.length = std::min(slice, r.length - off);
        t.index = static_cast<uint32_t>(i);
        t.gpu_device = gpu_device;
        t.gpu_local = gpu_local;
        t.gpu_remote = remote.value() >= 0;
        if (gpu_device >= 0) t.ready = ready;
        t.deadline = deadline;
        t.batch = state;
        v.push_back(std::move(t));
      }
    }
    for (auto& ep : keep) ep->Post(std::move(posts[ep.get()]));
    return std::make_unique<Batch>(std::move(state));
  }

 private:
  void ApplyEnv() {
    if (options_.transport.empty()) {
      if (auto t = env::Get("FERRY_TRANSPORT")) options_.transport = *t;
    }
    if (options_.transport == "auto") options_.transport.clear();
    forced_ = options_.transport;
    options_.tcp_lanes = static_cast<int>(env::GetInt("FERRY_TCP_LANES", options_.tcp_lanes));
    options_.tcp_chunk_bytes =
        static_cast<uint64_t>(env::GetInt("FERRY_TCP_CHUNK_BYTES", options_.tcp_chunk_bytes));
    options_.tcp_chunks_in_flight =
        static_cast<int>(env::GetInt("FERRY_TCP_INFLIGHT", options_.tcp_chunks_in_flight));
    options_.io_threads = static_cast<int>(env::GetInt("FERRY_IO_THREADS", options_.io_threads));
    options_.copy_threads =
        static_cast<int>(env::GetInt("FERRY_COPY_THREADS", options_.copy_threads));
    options_.landing_threads =
        static_cast<int>(env::GetInt("FERRY_LANDING_THREADS", options_.landing_threads));
  }

  // R7: a remote range must lie inside one registered buffer of the target,
  // as its descriptor says, before any byte moves; a transport that slices a
  // request would otherwise apply the slices that fit. A peer may have
  // registered memory since the descriptor was fetched, so a miss refetches
  // it once per submit, unless the watch follows the peer. Returns where the
  // buffer is: its GPU, or -1 for host memory.
  Result<int> CheckRemote(const Request& r, Segment& seg, std::set<SegmentId>* refreshed) {
    auto find = [&]() -> std::optional<int> {
      if (seg.is_self()) {
        auto reg = registry_.Find(r.remote, r.length);
        if (!reg) return std::nullopt;
        return reg->kind == gpu::MemoryKind::kDevice ? std::max(reg->device, 0) : -1;
      }
      auto d = seg.descriptor();
      const RegionDesc* g = d ? d->Find(r.remote, r.length) : nullptr;
      if (g == nullptr) return std::nullopt;
      if (g->kind != static_cast<uint8_t>(gpu::MemoryKind::kDevice)) return -1;
      // The peer's device index, where this process sees that many GPUs.
      return g->device >= 0 && g->device < gpu::DeviceCount() ? g->device : 0;
    };
    if (auto where = find()) return *where;
    // A peer the watch follows has no registration the page has not shown.
    if (!seg.is_self() && !seg.Watched() && refreshed->insert(seg.id()).second) {
      FERRY_RETURN_IF_ERROR(Refresh(seg));
      if (auto where = find()) return *where;
    }
    return Status(StatusCode::kOutOfRange,
                  fmt::format("0x{:x}+{} is not inside one registered buffer of {}", r.remote,
                              r.length, seg.name()));
  }

  // Whether the segment's memory is this process's: our own segment, or
  // another engine's in this process.
  static bool InThisProcess(const Segment& seg) {
    if (seg.is_self()) return true;
    auto d = seg.descriptor();
    return d && d->pid == static_cast<uint32_t>(getpid()) && d->host_id == HostIdentity();
  }

  // Where a request's GPU memory is: each side's device, -1 for host memory.
  // The remote side is CheckRemote's answer; the local side was classified at
  // registration, or is classified here for other buffers.
  struct Sides {
    int local = -1;
    int remote = -1;
    // The GPU that copies: the local one, else the remote one.
    int device() const { return local >= 0 ? local : remote; }
  };
  Sides GpuSides(const Request& r, int remote_device) const {
    Sides sides;
    sides.remote = remote_device;
    gpu::MemoryInfo local;
    if (auto reg = registry_.Find(reinterpret_cast<uint64_t>(r.local), r.length)) {
      local.kind = reg->kind;
      local.device = reg->device;
    } else {
      local = gpu::Classify(r.local);
    }
    if (local.kind == gpu::MemoryKind::kDevice) sides.local = std::max(local.device, 0);
    return sides;
  }

  // The registration generation lives in a page of its own memfd, which
  // same-host peers map: every registration and removal bumps it, and their
  // next submit sees the change with one load and refetches the descriptor.
  Status MakeGenerationPage() {
    generation_fd_ = memfd_create("ferry-generation", MFD_CLOEXEC);
    if (generation_fd_ < 0) return Status::FromErrno(errno, "memfd_create");
    if (ftruncate(generation_fd_, static_cast<off_t>(kGenerationPageBytes)) != 0)
      return Status::FromErrno(errno, "ftruncate");
    void* p =
        mmap(nullptr, kGenerationPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, generation_fd_, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap");
    generation_ = static_cast<uint64_t*>(p);
    return Status::Ok();
  }

  void BumpGeneration() { __atomic_add_fetch(generation_, 1, __ATOMIC_RELEASE); }

  static void ReleaseOwned(const Region& r) {
    if (r.pinned) gpu::UnpinHost(reinterpret_cast<void*>(r.addr));
    munmap(reinterpret_cast<void*>(r.addr), r.length);
    close(r.memfd);
  }

  EngineOptions options_;
  std::string forced_;
  int generation_fd_ = -1;
  uint64_t* generation_ = nullptr;        // the page's first word; see MakeGenerationPage
  std::atomic<uint64_t> next_serial_{1};  // RegionDesc::serial
  static constexpr Millis kWatchPeriod{2};
  static constexpr Millis kWatchBackoff{1000};
  static constexpr Millis kWatchIdle{1000};
  std::unique_ptr<Ticker> watch_;  // runs Watch; woken by a submit that waits for it
  std::unordered_map<SegmentId, Clock::time_point> retry_at_;  // Watch's own
  bool has_gpu_ = false;
  uint64_t epoch_ = 0;
  std::string name_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{
      asio::make_work_guard(io_)};
  std::vector<std::thread> io_threads_;
  MemoryRegistry registry_;
  std::unique_ptr<gpu::Copier> copier_;  // null without a GPU
  std::unique_ptr<StreamRelay> relay_;   // null without a GPU
  std::unique_ptr<ThreadPool> copy_pool_;
  std::unique_ptr<ThreadPool> landing_pool_;  // null without a GPU, or with landing_threads 0
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<EngineContext> ctx_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::mutex segments_mu_;
  std::unordered_map<SegmentId, std::shared_ptr<Segment>> segments_;  // guarded by segments_mu_
  SegmentId next_segment_ = 1;                                        // guarded by segments_mu_
};

Result<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  FERRY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

const std::string& Engine::name() const { return impl_->name(); }
uint64_t Engine::epoch() const { return impl_->epoch(); }
Status Engine::RegisterMemory(void* addr, size_t length) {
  return impl_->RegisterMemory(addr, length);
}
Status Engine::UnregisterMemory(void* addr) { return impl_->UnregisterMemory(addr); }
Result<void*> Engine::AllocateMemory(size_t length) { return impl_->AllocateMemory(length); }
Status Engine::FreeMemory(void* addr) { return impl_->FreeMemory(addr); }
Result<SegmentId> Engine::OpenSegment(std::string_view name) { return impl_->OpenSegment(name); }
Result<SegmentInfo> Engine::GetSegmentInfo(SegmentId id) { return impl_->GetSegmentInfo(id); }
Status Engine::CloseSegment(SegmentId id) { return impl_->CloseSegment(id); }

Result<std::unique_ptr<Batch>> Engine::Submit(std::span<const Request> requests,
                                              std::chrono::milliseconds timeout) {
  SubmitOptions o;
  o.timeout = timeout;
  return impl_->Submit(requests, o);
}

Result<std::unique_ptr<Batch>> Engine::Submit(std::span<const Request> requests,
                                              const SubmitOptions& options) {
  return impl_->Submit(requests, options);
}

Result<std::unique_ptr<Batch>> Engine::SubmitOnStream(std::span<const Request> requests,
                                                      void* stream) {
  return impl_->SubmitOnStream(requests, stream);
}

Status Engine::Transfer(const Request& request, std::chrono::milliseconds timeout) {
  auto b = Submit(std::span<const Request>(&request, 1), timeout);
  if (!b.ok()) return b.status();
  // Transports enforce the request's deadline; the slack covers bookkeeping.
  Millis t = timeout.count() > 0 ? timeout : impl_->request_timeout();
  return b.value()->Wait(t + std::chrono::seconds(5));
}

}  // namespace ferry
