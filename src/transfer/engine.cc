// The engine's facade: it makes the parts, in order, and hands each call to
// the one that owns it. The parts:
//   registry.h      the transports, forcing, offering and routing by caps
//   local_memory.h  this engine's registered and allocated memory
//   peers.h         the segments opened, their descriptors and the watch
//   router.h        validation and where each side of a request is
//   submit.h        the two submit paths
//   listener.h      accepting, dispatch and the p2p metadata service
#include "ferry/engine.h"

#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <optional>
#include <random>

#include "common/auth.h"
#include "common/cache.h"
#include "common/cpu_claim.h"
#include "common/cpu_quota.h"
#include "common/env.h"
#include "common/host.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/thread_pool.h"
#include "common/ticker.h"
#include "coord/etcd_url.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/etcd_metadata.h"
#include "transfer/frame_service.h"
#include "transfer/io_pool.h"
#include "transfer/listener.h"
#include "transfer/local_memory.h"
#include "transfer/peers.h"
#include "transfer/registry.h"
#include "transfer/router.h"
#include "transfer/stream_relay.h"
#include "transfer/submit.h"

namespace ferry {
namespace {

// Stream-ordered batches relayed at once, and each one's window of staged
// bytes between a signal and a wait on the caller's stream.
constexpr size_t kRelaySlots = 4;
constexpr size_t kRelayWindowBytes = 4 << 20;

}  // namespace

class Engine::Impl {
 public:
  explicit Impl(EngineOptions o) : options_(std::move(o)) {}

  ~Impl() {
    if (etcd_) etcd_->Stop();    // withdraws our entry; its watch reaches the peer table
    if (watch_) watch_->Stop();  // its job reaches the peer table
    watch_.reset();
    if (listener_) listener_->Stop();
    if (peers_) peers_->CloseAll();
    relay_.reset();  // releases any stream still waiting on it
    // Let the io threads run the close handlers, then stop them. (None run
    // when Init failed early: there is nothing to wait for.)
    io_.Stop(std::chrono::seconds(2));
    if (transports_) transports_->StopAll();
    listener_.reset();
    submitter_.reset();
    router_.reset();
    peers_.reset();
    transports_.reset();  // after the io threads, which serve their frames
    copy_pool_.reset();
    copier_.reset();  // after the copy threads, which enqueue on it
    memory_.reset();  // frees what the engine allocated
  }

  Status Init() {
    FERRY_RETURN_IF_ERROR(ApplyEnv());
    FERRY_ASSIGN_OR_RETURN(key_, auth::LoadConfigured(options_.auth_key_file));
    FERRY_RETURN_IF_ERROR(ConnectMetadata());
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                        static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    do {
      epoch_ = gen();
    } while (epoch_ == 0);

    const bool has_gpu = gpu::DeviceCount() > 0;
    FERRY_LOG_INFO("engine: {}", gpu::Describe());
    if (has_gpu) {
      auto copier = gpu::Copier::Create();
      if (!copier.ok()) return copier.status();
      copier_ = std::move(copier).value();
      auto relay = StreamRelay::Create(copier_.get(), kRelaySlots, kRelayWindowBytes,
                                       options_.request_timeout);
      if (relay.ok()) {
        relay_ = std::move(relay).value();
      } else {
        FERRY_LOG_WARN("stream relay: no staging slots: {}", relay.status().ToString());
      }
    }
    FERRY_ASSIGN_OR_RETURN(memory_, LocalMemory::Create(has_gpu, options_.populate_registered));
    const int copy = options_.copy_threads > 0 ? options_.copy_threads
                     : cpus::Parallel() >= 16  ? 4
                                               : 2;
    options_.copy_threads = copy;
    copy_pool_ = std::make_unique<ThreadPool>(copy, "ferry-copy");
    ctx_ = std::make_unique<EngineContext>(
        EngineContext{options_, io_, *copy_pool_, memory_->registry(), copier_.get(), key_});
    FERRY_ASSIGN_OR_RETURN(transports_, TransportSet::Create(*ctx_, options_.transport));
    if (options_.io_threads <= 0) options_.io_threads = transports_->io_threads();
    const int io_threads = options_.io_threads;
    options_.io_spin_us = EffectiveIoSpinUs(options_.io_spin_us, io_threads, cpus::Budget());
    io_.Create(io_threads, options_.io_shared, std::chrono::microseconds(options_.io_spin_us));
    memory_->set_describer([this](const Region& r, const gpu::MemoryInfo& info) {
      return transports_->DescribeMemory(r, info);
    });
    FERRY_RETURN_IF_ERROR(transports_->OfferAll());

    Listener::Config cfg;
    cfg.host = options_.host;
    cfg.port = options_.port;
    cfg.epoch = epoch_;
    cfg.frame_timeout = options_.request_timeout;
    cfg.handshake_timeout = options_.connect_timeout;  // what our own connects allow
    cfg.key = key_;
    cfg.rcv_lowat_ceiling = RcvLowatCeiling(options_.io_spin_us);
    FERRY_ASSIGN_OR_RETURN(int64_t max_connections, env::GetInt("FERRY_MAX_CONNECTIONS", 1024));
    // A quarter by default, at least room for a few engines' lanes from one host.
    FERRY_ASSIGN_OR_RETURN(int64_t per_source,
                           env::GetInt("FERRY_MAX_CONNECTIONS_PER_SOURCE",
                                       std::max<int64_t>(16, max_connections / 4)));
    if (max_connections < 1 || per_source < 1) {
      return Status::InvalidArgument(
          "FERRY_MAX_CONNECTIONS and FERRY_MAX_CONNECTIONS_PER_SOURCE must be at least 1");
    }
    cfg.max_connections = static_cast<size_t>(max_connections);
    cfg.max_connections_per_source = static_cast<size_t>(per_source);
    cfg.place = [this]() -> asio::io_context& { return io_.Next(); };
    auto l = Listener::Start(
        io_.first(), cfg, [this] { return EncodeDescriptor(Describe()); },
        transports_->frame_services());
    if (!l.ok()) return l.status();
    listener_ = std::move(l).value();
    name_ =
        (options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host) +
        ":" + std::to_string(listener_->port());

    // With or without a GPU, so hosts without one run the same refresh path.
    watch_ = std::make_unique<Ticker>("ferry-watch", PeerTable::kWatchPeriod, [this](bool woken) {
      watch_->SetPeriod(peers_->WatchRound(woken));
    });
    PeerTable::Config pc{name_, options_.connect_timeout, [this] { return Describe(); }, key_};
    if (etcd_) pc.fetch = [this](const std::string& name) { return etcd_->Fetch(name); };
    peers_ = std::make_unique<PeerTable>(std::move(pc), watch_.get());
    router_ = std::make_unique<Router>(*transports_, *peers_, memory_->registry(), has_gpu);
    submitter_ = std::make_unique<Submitter>(*router_, *peers_, copier_.get(), relay_.get(),
                                             options_.request_timeout);
    const std::vector<int> io_cpus = IoCpus(io_threads);
    io_.Start("ferry-io", io_cpus);
    if (helpers_on_io_cpus_ && !io_cpus.empty()) FERRY_RETURN_IF_ERROR(ConfineHelpers(io_cpus));
    watch_->Start();
    if (etcd_) {
      FERRY_RETURN_IF_ERROR(etcd_->Start(
          name_, [this] { return Describe(); },
          [this](const std::string& peer) { peers_->Invalidate(peer); }));
    }
    return Status::Ok();
  }

  // After a registration change: etcd metadata publishes the new descriptor.
  Status Published(Status st) {
    if (st.ok() && etcd_) etcd_->Republish();
    return st;
  }

  const std::string& name() const { return name_; }
  uint64_t epoch() const { return epoch_; }
  EngineStats Stats() const { return {listener_->auth_failures()}; }
  const EngineOptions& options() const { return options_; }
  Millis request_timeout() const { return options_.request_timeout; }
  LocalMemory& memory() { return *memory_; }
  PeerTable& peers() { return *peers_; }
  Submitter& submitter() { return *submitter_; }

  Result<SegmentId> OpenSegment(std::string_view name) {
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Segment> seg, peers_->Open(name));
    router_->Prepare(seg);
    return seg->id();
  }

 private:
  // p2p needs nothing; etcd:// is parsed and etcd asked to answer now, so a
  // typo or an unreachable etcd fails Create rather than the first open.
  Status ConnectMetadata() {
    if (options_.metadata == "p2p") return Status::Ok();
    if (!coord::IsEtcdUrl(options_.metadata)) {
      return Status::NotSupported("metadata '" + options_.metadata +
                                  "' is not supported; use p2p or "
                                  "etcd://host:port[,host:port]/CLUSTER");
    }
    FERRY_ASSIGN_OR_RETURN(etcd_, EtcdMetadata::Connect(options_.metadata, options_.connect_timeout,
                                                        options_.metadata_ttl.count()));
    return Status::Ok();
  }

  // The CPUs of the io threads, as options_.io_cpus says; none: unpinned.
  std::vector<int> IoCpus(int io_threads) {
    if (options_.io_cpus != "auto") return io_cpu_list_;  // "off": empty
    const std::vector<int> allowed = cpus::Allowed();
    if (allowed.size() < 8) return {};
    io_claim_ =
        cpus::Claim::Take(cpus::DefaultRegistry(), allowed, static_cast<size_t>(io_threads));
    if (io_claim_.cpus().empty()) {
      FERRY_LOG_INFO("io threads left unpinned: fewer than {} CPUs unclaimed", io_threads);
    }
    return io_claim_.cpus();
  }

  // The threads that serve the io threads' work (the GPU copier's, the
  // landing threads) go on the io threads' CPUs, off those of other
  // processes' io threads (an experiment: FERRY_HELPER_CPUS).
  Status ConfineHelpers(const std::vector<int>& cpus) {
    if (copier_) FERRY_RETURN_IF_ERROR(copier_->ConfineThread(cpus));
    return transports_->ConfineHelpers(cpus);
  }

  // InvalidArgument, naming the variable, where one is malformed.
  Status ApplyEnv() {
    if (options_.transport.empty()) {
      if (auto t = env::Get("FERRY_TRANSPORT")) options_.transport = *t;
    }
    if (options_.transport == "auto") options_.transport.clear();
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_TCP_LANES", &options_.tcp_lanes));
    options_.tcp_lanes = EffectiveTcpLanes(options_.tcp_lanes);
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_TCP_GPU_LANES", &options_.tcp_gpu_lanes));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_TCP_CHUNK_BYTES", &options_.tcp_chunk_bytes));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_TCP_GPU_CHUNK_BYTES", &options_.tcp_gpu_chunk_bytes));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_TCP_INFLIGHT", &options_.tcp_chunks_in_flight));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_TCP_STAGING_BUFFERS", &options_.tcp_staging_buffers));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_IO_THREADS", &options_.io_threads));
    FERRY_RETURN_IF_ERROR(BoolFromEnv("FERRY_IO_SHARED", &options_.io_shared));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_IO_SPIN_US", &options_.io_spin_us));
    if (options_.io_spin_us < -1 || options_.io_spin_us > 10000) {
      return Status::InvalidArgument(
          "io_spin_us (FERRY_IO_SPIN_US) must be 0 to 10000, or -1 for the default");
    }
    if (auto v = env::Get("FERRY_IO_CPUS")) options_.io_cpus = *v;
    if (options_.io_cpus != "auto" && options_.io_cpus != "off") {
      auto list = cpus::ParseList(options_.io_cpus);
      if (!list.ok()) {
        return Status::InvalidArgument("io_cpus (FERRY_IO_CPUS) must be auto, off or a list: " +
                                       list.status().message());
      }
      io_cpu_list_ = std::move(list).value();
    }
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_COPY_THREADS", &options_.copy_threads));
    FERRY_RETURN_IF_ERROR(IntFromEnv("FERRY_LANDING_THREADS", &options_.landing_threads));
    FERRY_RETURN_IF_ERROR(BoolFromEnv("FERRY_HELPER_CPUS", &helpers_on_io_cpus_));
    FERRY_RETURN_IF_ERROR(BoolFromEnv("FERRY_TCP_CHECKSUM", &options_.tcp_checksum));
    FERRY_RETURN_IF_ERROR(BoolFromEnv("FERRY_POPULATE_REGISTERED", &options_.populate_registered));
    // Read where they are used, later or lazily; checked here so Create refuses them.
    FERRY_RETURN_IF_ERROR(CheckWriteBackEnv());
    return log::CheckLevelEnv();
  }

  // `*knob` = the integer variable `name`, where it is set.
  template <typename T>
  static Status IntFromEnv(const char* name, T* knob) {
    FERRY_ASSIGN_OR_RETURN(int64_t v, env::GetInt(name, static_cast<int64_t>(*knob)));
    *knob = static_cast<T>(v);
    return Status::Ok();
  }

  // Strictly 0 or 1, so a typo is refused rather than read as either.
  static Status BoolFromEnv(const char* name, bool* knob) {
    FERRY_ASSIGN_OR_RETURN(int64_t v, env::GetInt(name, *knob ? 1 : 0));
    if (v != 0 && v != 1) {
      return Status::InvalidArgument(std::string(name) + " must be 0 or 1, not " +
                                     std::to_string(v));
    }
    *knob = v == 1;
    return Status::Ok();
  }

  // This engine's descriptor, as peers fetch it.
  SegmentDescriptor Describe() const {
    SegmentDescriptor d;
    d.epoch = epoch_;
    d.host_id = HostIdentity();
    d.pid = static_cast<uint32_t>(getpid());
    // Read before the regions: a removal in between only costs peers a refresh.
    d.generation = memory_->generation();
    d.control_memfd = memory_->generation_fd();
    d.transports = transports_->offered();
    d.transport_blobs = transports_->DescribeSegment();
    for (const Region& r : memory_->registry().Snapshot()) {
      d.regions.push_back(
          {r.addr, r.length, static_cast<uint8_t>(r.kind), r.device, r.owned, r.serial, r.blobs});
    }
    return d;
  }

  EngineOptions options_;
  std::shared_ptr<const auth::Key> key_;  // the cluster secret; null: none
  uint64_t epoch_ = 0;
  std::string name_;
  std::vector<int> io_cpu_list_;     // io_cpus as a list, parsed by ApplyEnv
  bool helpers_on_io_cpus_ = false;  // FERRY_HELPER_CPUS
  cpus::Claim io_claim_;             // the io threads' CPUs under "auto"; released after they stop
  IoPool io_;
  std::unique_ptr<gpu::Copier> copier_;  // null without a GPU
  std::unique_ptr<StreamRelay> relay_;   // null without a GPU
  std::unique_ptr<LocalMemory> memory_;
  std::unique_ptr<ThreadPool> copy_pool_;
  std::unique_ptr<EngineContext> ctx_;
  std::unique_ptr<TransportSet> transports_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Ticker> watch_;  // runs PeerTable::WatchRound; woken by the table
  std::unique_ptr<PeerTable> peers_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<Submitter> submitter_;
  std::unique_ptr<EtcdMetadata> etcd_;  // null: p2p
};

// On 16 cores, 8 lanes moved 38% more than 4 for 1 MiB reads and 60-70% more
// through the store, 7% more for 1 MiB writes (H200 machine, 2026-12-03). On
// the 2-core VM, with an io thread per core, 2 lanes (one a thread) moved more
// than 4 in all 6 cases, by 5-50% (2026-12-04, docs/performance.md).
int EffectiveTcpLanes(int tcp_lanes, int cores) {
  if (tcp_lanes != 0) return tcp_lanes;
  return cores >= 16 ? 8 : cores >= 4 ? 4 : 2;
}

int EffectiveTcpLanes(int tcp_lanes) { return EffectiveTcpLanes(tcp_lanes, cpus::Parallel()); }

// Polling paid where io threads are few next to the cores: on the H200
// machine (16 cores) 50 µs lifted 1 MiB writes by 10% with 4 io threads, and
// on the 2-core VM (one) by 5-15%; with 8 io threads, the default there, it
// cost 1 MiB writes and reads 15-17% and 64 KiB writes 13%: each side's
// threads polled while the other side's needed the cores.
// Below 4 cores an io thread per core (DefaultIoThreads) leaves two
// processes' threads more than the cores: on the 2-core VM two io threads a
// process that polled 50 µs lost a quarter to a third of every case against
// sleeping at once. One thread a process there polls, as it gained.
int EffectiveIoSpinUs(int io_spin_us, int io_threads, int cores) {
  if (io_spin_us != -1) return io_spin_us;
  const bool crowded = cores >= 4 ? 2 * io_threads >= cores : 2 * io_threads > cores;
  return crowded ? 0 : 50;
}

// A lane's socket keeps one io thread busy at large chunks (86% on the H200
// machine), so lanes get a thread each where half the cores allow: 8 lanes
// on 16 cores moved 23.0 GB/s with 8 threads and 14.1 with 4. On the 2-core
// VM one thread did all of a process's sending, on one core, while raw
// streams send from both; a thread per core, sleeping at once when idle
// (EffectiveIoSpinUs), moved a fifth more at 1 MiB (docs/performance.md).
int DefaultIoThreads(int cores, int lanes) {
  const int wanted = cores < 4 ? cores : cores / 2;
  return std::clamp(wanted, 1, std::max(1, lanes));
}

Result<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  FERRY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

const std::string& Engine::name() const { return impl_->name(); }
uint64_t Engine::epoch() const { return impl_->epoch(); }
EngineStats Engine::Stats() const { return impl_->Stats(); }
const EngineOptions& Engine::options() const { return impl_->options(); }
Status Engine::RegisterMemory(void* addr, size_t length) {
  return impl_->Published(impl_->memory().Register(addr, length));
}
Status Engine::UnregisterMemory(void* addr) {
  return impl_->Published(impl_->memory().Unregister(addr));
}
Result<void*> Engine::AllocateMemory(size_t length) {
  auto p = impl_->memory().Allocate(length);
  if (p.ok()) (void)impl_->Published(Status::Ok());
  return p;
}
Status Engine::FreeMemory(void* addr) { return impl_->Published(impl_->memory().Free(addr)); }
Result<SegmentId> Engine::OpenSegment(std::string_view name) { return impl_->OpenSegment(name); }
Result<SegmentInfo> Engine::GetSegmentInfo(SegmentId id) { return impl_->peers().Info(id); }
Status Engine::CloseSegment(SegmentId id) { return impl_->peers().Close(id); }

Result<std::unique_ptr<Batch>> Engine::Submit(std::span<const Request> requests,
                                              std::chrono::milliseconds timeout) {
  SubmitOptions o;
  o.timeout = timeout;
  return impl_->submitter().Submit(requests, o);
}

Result<std::unique_ptr<Batch>> Engine::Submit(std::span<const Request> requests,
                                              const SubmitOptions& options) {
  return impl_->submitter().Submit(requests, options);
}

Result<std::unique_ptr<Batch>> Engine::SubmitOnStream(std::span<const Request> requests,
                                                      void* stream) {
  return impl_->submitter().SubmitOnStream(requests, stream);
}

Status Engine::Transfer(const Request& request, std::chrono::milliseconds timeout) {
  auto b = Submit(std::span<const Request>(&request, 1), timeout);
  if (!b.ok()) return b.status();
  // Transports enforce the request's deadline; the slack covers bookkeeping.
  Millis t = timeout.count() > 0 ? timeout : impl_->request_timeout();
  return b.value()->Wait(t + std::chrono::seconds(5));
}

}  // namespace ferry
