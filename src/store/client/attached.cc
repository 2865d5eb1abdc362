// The attached store: an application's Store served by its host's node over
// the attach socket (store/rpc/attach_wire.h). One call at a time per Store:
// the connection and the staging area are shared by every call.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string_view>

#include "common/bytes.h"
#include "gpu/gpu.h"
#include "gpu/interprocess.h"
#include "store/client/store_impl.h"
#include "store/rpc/attach_wire.h"
#include "store/rpc/limits.h"

namespace ferry {
namespace {

using store::Part;
using store::Sink;
using store::Source;
using store::attach::Frame;
using store::attach::Type;
namespace attach = store::attach;

Status NotRegistered() {
  return Status(StatusCode::kInvalidArgument, "buffer is not inside a registered buffer");
}

Status ReadStatus(ByteReader& r) {
  const uint8_t code = r.U8();
  std::string msg = r.Str(attach::kMaxMessage);
  if (code > static_cast<uint8_t>(kLastStatusCode)) {
    return Status(StatusCode::kProtocolError, "node sent an unknown status code");
  }
  if (code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(code), std::move(msg));
}

// One part as the wire names it: a registered buffer's id, or GPU memory's
// device and IPC handle; then the offset (in the buffer, or the allocation)
// and the length.
struct WireRef {
  uint8_t kind = attach::kPartBuffer;
  uint32_t buf = 0;
  int device = -1;
  std::string handle;
  uint64_t off = 0;
  uint64_t len = 0;
};

struct GpuPlan;

// Checks every key into (*st)[i]; the indices of the valid ones, to send.
std::vector<size_t> ValidKeys(std::span<const std::string> keys, std::vector<Status>* st) {
  std::vector<size_t> index;
  st->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    (*st)[i] = store::CheckKey(keys[i]);
    if ((*st)[i].ok()) index.push_back(i);
  }
  return index;
}

// The range map's entry holding [p, p+n), or end().
template <typename Map>
auto Containing(Map& m, const void* p, size_t n) {
  const auto a = reinterpret_cast<uint64_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return m.end();
  --it;
  const uint64_t size = it->second.size;
  if (a - it->first <= size && n <= size - (a - it->first)) return it;
  return m.end();
}

class AttachedStore final : public Store::Impl {
 public:
  AttachedStore(std::string path, StoreOptions options)
      : path_(std::move(path)), opts_(std::move(options)) {}
  ~AttachedStore() override {
    if (fd_ >= 0) close(fd_);
  }

  Status Start() {
    FERRY_ASSIGN_OR_RETURN(staging_.mem, StoreMemory::Create(opts_.attach_staging));
    std::lock_guard lock(mu_);
    return Connect();
  }

  const std::string& segment() const override { return segment_; }
  const std::string& master_address() const override { return master_; }

  Status RegisterBuffer(void* data, size_t size) override {
    if (data == nullptr || size == 0) {
      return Status(StatusCode::kInvalidArgument, "a buffer needs an address and a size");
    }
    std::lock_guard lock(mu_);
    const auto a = reinterpret_cast<uint64_t>(data);
    auto next = registered_.lower_bound(a);
    if ((next != registered_.end() && next->first < a + size) ||
        (next != registered_.begin() && std::prev(next)->first + std::prev(next)->second.size > a)) {
      return Status(StatusCode::kAlreadyExists, "the buffer overlaps a registered one");
    }
    registered_[a] = {size, nullptr, 0};
    return Status::Ok();
  }

  Status UnregisterBuffer(void* data) override {
    std::lock_guard lock(mu_);
    auto it = registered_.find(reinterpret_cast<uint64_t>(data));
    if (it == registered_.end()) return Status(StatusCode::kNotFound, "buffer is not registered");
    if (it->second.mem != nullptr && fd_ >= 0) {
      std::vector<uint8_t> p;
      ByteWriter(&p).U32(it->second.id);
      (void)Call(Type::kUnregister, p);  // the node forgets it on disconnect anyway
    }
    registered_.erase(it);
    return Status::Ok();
  }

  Result<std::shared_ptr<StoreMemory>> AllocateBuffer(size_t size) override {
    FERRY_ASSIGN_OR_RETURN(auto mem, StoreMemory::Create(size));
    std::lock_guard lock(mu_);
    FERRY_RETURN_IF_ERROR(EnsureConnected());
    FERRY_ASSIGN_OR_RETURN(uint32_t id, Share(*mem));
    registered_[reinterpret_cast<uint64_t>(mem->data())] = {size, mem, id};
    return mem;
  }

  std::vector<Status> Put(std::span<const std::string> keys, std::span<const Source> values,
                          const PutOptions& po, bool registered) override;
  std::vector<Result<size_t>> Get(std::span<const std::string> keys, std::span<Sink> sinks,
                                  bool registered, const GetOptions& options) override;

  std::vector<Status> Exists(std::span<const std::string> keys) override {
    return KeyOp(Type::kExists, keys, [](ByteWriter&) {});
  }
  std::vector<Status> Remove(std::span<const std::string> keys, bool force) override {
    return KeyOp(Type::kRemove, keys, [&](ByteWriter& w) { w.U8(force ? 1 : 0); });
  }
  std::vector<Status> Pin(std::span<const std::string> keys, StorePin pin,
                          std::chrono::milliseconds ttl) override {
    return KeyOp(Type::kPin, keys, [&](ByteWriter& w) {
      w.U8(static_cast<uint8_t>(pin));
      w.U64(static_cast<uint64_t>(std::max<int64_t>(ttl.count(), 0)));
    });
  }
  std::vector<Result<ObjectLocation>> Locate(std::span<const std::string> keys) override;

  Result<uint64_t> RemoveAll(bool force) override {
    std::lock_guard lock(mu_);
    std::vector<uint8_t> p;
    ByteWriter(&p).U8(force ? 1 : 0);
    FERRY_ASSIGN_OR_RETURN(Frame f, Call(Type::kRemoveAll, p));
    ByteReader r(f.payload.data(), f.payload.size());
    const uint64_t removed = r.U64();
    if (!r.ok()) return Drop(Status(StatusCode::kProtocolError, "malformed RemoveAll reply"));
    return removed;
  }

  Result<StoreStats> Stats() override {
    std::lock_guard lock(mu_);
    FERRY_ASSIGN_OR_RETURN(Frame f, Call(Type::kStats, {}));
    ByteReader r(f.payload.data(), f.payload.size());
    StoreStats s{r.U64(), r.U64(), r.U64(), r.U64()};
    if (!r.ok()) return Drop(Status(StatusCode::kProtocolError, "malformed Stats reply"));
    return s;
  }

 private:
  // A registered range: with `mem`, memory shared with the node as buffer `id`.
  struct Range {
    uint64_t size = 0;
    std::shared_ptr<StoreMemory> mem;
    uint32_t id = 0;
  };
  struct Staging {
    std::shared_ptr<StoreMemory> mem;
    uint32_t id = 0;
  };

  Status Connect();
  Status EnsureConnected() { return fd_ >= 0 ? Status::Ok() : Connect(); }
  Result<uint32_t> Share(const StoreMemory& mem);
  // Closes the connection after a failure that leaves its state unknown.
  Status Drop(Status st) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return st;
  }
  // Sends a request and returns its reply frame with an OK code; a call-level
  // failure is the node's status. Requires mu_.
  Result<Frame> Call(Type type, std::span<const uint8_t> payload, int fd = -1);
  template <typename Extra>
  std::vector<Status> KeyOp(Type type, std::span<const std::string> keys, Extra&& extra);
  Millis Timeout() const { return std::max(opts_.rpc_timeout, Millis(1)); }
  // Records this call's readiness on `stream` for the GPU memory in `plan`:
  // *event is the handle the node waits on (empty when there is none, or
  // when the fallback has already waited on the CPU).
  Status Ready(const GpuPlan& plan, void* stream, std::string* event);

  const std::string path_;
  const StoreOptions opts_;
  std::mutex mu_;  // one call at a time; guards everything below
  int fd_ = -1;
  uint64_t next_id_ = 1;
  std::string segment_, master_;
  Staging staging_;
  std::map<uint64_t, Range> registered_;  // by address
  std::map<int, std::unique_ptr<gpu::IpcEvent>> events_;  // by device, made on first use
};

Status AttachedStore::Connect() {
  sockaddr_un sa{};
  if (path_.empty() || path_.size() >= sizeof(sa.sun_path)) {
    return Status(StatusCode::kInvalidArgument, "bad attach socket path '" + path_ + "'");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path_.c_str(), path_.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    const int err = errno;
    close(fd);
    return Status(StatusCode::kUnavailable,
                  "no node to attach to at " + path_ + ": " + std::strerror(err));
  }
  fd_ = fd;
  std::vector<uint8_t> hello;
  ByteWriter(&hello).U32(static_cast<uint32_t>(getpid()));
  auto f = Call(Type::kHello, hello);
  if (!f.ok()) {
    (void)Drop(Status::Ok());
    return Status(StatusCode::kUnavailable, "attach to " + path_ + ": " + f.status().message());
  }
  ByteReader r(f.value().payload.data(), f.value().payload.size());
  std::string segment = r.Str(attach::kMaxMessage);
  std::string master = r.Str(attach::kMaxMessage);
  (void)r.U64();  // the node's instance, for logs
  (void)r.U32();
  if (!r.ok()) return Drop(Status(StatusCode::kProtocolError, "malformed Hello reply"));
  segment_ = std::move(segment);
  master_ = std::move(master);
  // A new node knows none of this process's memory: share it again.
  auto id = Share(*staging_.mem);
  if (!id.ok()) return Drop(id.status());
  staging_.id = id.value();
  for (auto& [addr, range] : registered_) {
    if (range.mem == nullptr) continue;
    id = Share(*range.mem);
    if (!id.ok()) return Drop(id.status());
    range.id = id.value();
  }
  return Status::Ok();
}

Result<uint32_t> AttachedStore::Share(const StoreMemory& mem) {
  std::vector<uint8_t> p;
  ByteWriter(&p).U64(mem.size());
  FERRY_ASSIGN_OR_RETURN(Frame f, Call(Type::kRegister, p, mem.fd()));
  ByteReader r(f.payload.data(), f.payload.size());
  const uint32_t id = r.U32();
  if (!r.ok()) return Drop(Status(StatusCode::kProtocolError, "malformed Register reply"));
  return id;
}

Result<Frame> AttachedStore::Call(Type type, std::span<const uint8_t> payload, int fd) {
  if (type != Type::kHello) FERRY_RETURN_IF_ERROR(EnsureConnected());
  const uint64_t id = next_id_++;
  const Deadline deadline = Deadline::After(Timeout());
  Status st = attach::Send(fd_, type, id, static_cast<uint32_t>(std::min<int64_t>(
                                              Timeout().count(), attach::kMaxDeadlineMs)),
                           StatusCode::kOk, payload, deadline, fd);
  Result<Frame> reply = st;
  if (st.ok()) reply = attach::Receive(fd_, deadline, Timeout());
  if (reply.ok() && reply.value().fd >= 0) {
    close(reply.value().fd);
    reply = Status(StatusCode::kProtocolError, "the node sent a file descriptor");
  }
  if (reply.ok() && (reply.value().id != id || reply.value().type != type)) {
    reply = Status(StatusCode::kProtocolError, "the node answered another request");
  }
  if (!reply.ok()) {
    const Status& e = reply.status();
    if (e.code() == StatusCode::kConnectionLost) {
      return Drop(Status(StatusCode::kConnectionLost,
                         "the node at " + path_ + " went away (" + e.message() +
                             "); the next call attaches again"));
    }
    return Drop(e);
  }
  FERRY_RETURN_IF_ERROR(attach::ReplyStatus(reply.value()));
  return reply;
}

template <typename Extra>
std::vector<Status> AttachedStore::KeyOp(Type type, std::span<const std::string> keys,
                                         Extra&& extra) {
  std::vector<Status> out;
  const std::vector<size_t> index = ValidKeys(keys, &out);
  std::lock_guard lock(mu_);
  for (size_t first = 0; first < index.size(); first += attach::kMaxItems) {
    const size_t n = std::min<size_t>(attach::kMaxItems, index.size() - first);
    std::span<const size_t> part(index.data() + first, n);
    std::vector<uint8_t> p;
    ByteWriter w(&p);
    extra(w);
    w.U32(static_cast<uint32_t>(n));
    for (size_t i : part) w.Str(keys[i]);
    auto f = Call(type, p);
    ByteReader r(f.ok() ? f.value().payload.data() : nullptr, f.ok() ? f.value().payload.size() : 0);
    const bool counted = f.ok() && r.U32() == n;
    for (size_t i : part) out[i] = !f.ok() ? f.status() : counted ? ReadStatus(r) : Status();
    if (f.ok() && (!counted || !r.ok())) {
      Status bad = Drop(Status(StatusCode::kProtocolError, "malformed reply from the node"));
      for (size_t i : part) out[i] = bad;
    }
  }
  return out;
}

// A call's GPU memory, classified once: the device it is on, each part's
// IPC handle and offset in its allocation, and whether some of it cannot be
// exported (then the whole call goes through staging, copied on the stream).
struct GpuPlan {
  int device = -1;
  bool fallback = false;
  std::map<const uint8_t*, std::pair<std::string, uint64_t>> exported;  // part -> handle, offset
  std::set<const uint8_t*> gpu;                                          // every GPU part
};

// Classifies `parts` into `plan`; InvalidArgument for GPU memory on two
// devices, or on another device than `stream`'s.
Status PlanGpu(std::span<const Part* const> parts, void* stream, GpuPlan* plan) {
  if (gpu::DeviceCount() == 0) return Status::Ok();
  // First, before any other CUDA call: a put or get must really run now, so a
  // stream being captured into a graph is refused rather than captured.
  if (stream != nullptr) {
    FERRY_ASSIGN_OR_RETURN(bool capturing, gpu::StreamCapturing(stream));
    if (capturing) {
      return Status(StatusCode::kNotSupported,
                    "the stream is being captured into a CUDA graph; the store moves data "
                    "now, so call it outside the capture");
    }
  }
  for (const Part* part : parts) {
    if (part->size == 0) continue;  // nothing to move
    const gpu::MemoryInfo info = gpu::Classify(part->data);
    if (info.kind != gpu::MemoryKind::kDevice) continue;
    if (plan->device >= 0 && info.device != plan->device) {
      return Status(StatusCode::kInvalidArgument,
                    "GPU memory on two devices in one call; one submission stream covers one");
    }
    plan->device = info.device;
    plan->gpu.insert(part->data);
    std::string handle = gpu::ExportIpc(info);
    if (handle.empty()) {
      plan->fallback = true;  // a caching or virtual-memory allocator, say
    } else {
      plan->exported[part->data] = {std::move(handle),
                                    reinterpret_cast<uint64_t>(part->data) - info.alloc_base};
    }
  }
  if (plan->device < 0 || stream == nullptr) return Status::Ok();
  FERRY_ASSIGN_OR_RETURN(int on, gpu::StreamDevice(stream));
  if (on != plan->device) {
    return Status(StatusCode::kInvalidArgument, "the stream is on GPU " + std::to_string(on) +
                                                    ", the memory on GPU " +
                                                    std::to_string(plan->device));
  }
  return Status::Ok();
}

// Test-only: FERRY_TEST_ATTACH_SKIP_READINESS=1 sends GPU memory without the
// readiness event, so the tests can show that their check catches stale reads.
bool SkipReadiness() {
  static const bool skip = [] {
    const char* v = std::getenv("FERRY_TEST_ATTACH_SKIP_READINESS");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return skip;
}

void WriteRef(ByteWriter& w, const WireRef& ref) {
  w.U8(ref.kind);
  if (ref.kind == attach::kPartGpu) {
    w.U32(static_cast<uint32_t>(ref.device));
    w.Str(ref.handle);
  } else {
    w.U32(ref.buf);
  }
  w.U64(ref.off);
  w.U64(ref.len);
}

Status AttachedStore::Ready(const GpuPlan& plan, void* stream, std::string* event) {
  event->clear();
  if (plan.device < 0) return Status::Ok();
  auto& ev = events_[plan.device];
  if (ev == nullptr) {
    FERRY_ASSIGN_OR_RETURN(ev, gpu::IpcEvent::Create(plan.device));
  }
  FERRY_RETURN_IF_ERROR(ev->Record(stream));
  if (SkipReadiness()) return Status::Ok();
  // The staging fallback's copies follow the event on the stream anyway.
  if (plan.fallback || opts_.attach_readiness == AttachReadiness::kSynchronize) {
    return ev->Synchronize();
  }
  *event = ev->handle();  // the node's stream waits for it on the GPU
  return Status::Ok();
}

void WriteReadiness(ByteWriter& w, const GpuPlan& plan, const std::string& event) {
  w.I32(plan.fallback ? -1 : plan.device);
  w.Str(plan.fallback ? std::string() : event);
}

std::vector<Status> AttachedStore::Put(std::span<const std::string> keys,
                                       std::span<const Source> values, const PutOptions& po,
                                       bool registered) {
  std::vector<Status> out(keys.size());
  if (values.size() != keys.size()) {
    out.assign(keys.size(),
               Status(StatusCode::kInvalidArgument, "keys and values differ in count"));
    return out;
  }
  std::lock_guard lock(mu_);
  const uint64_t cap = staging_.mem->size();
  auto* staging = static_cast<uint8_t*>(staging_.mem->data());
  // Every item checked first, and the call's GPU memory planned: on any
  // failure there, nothing is sent.
  std::vector<const Part*> all;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<Part>& parts = values[i].parts;
    out[i] = store::CheckKey(keys[i]);
    if (out[i].ok() && (parts.empty() || parts.size() > attach::kMaxParts)) {
      out[i] = Status(StatusCode::kInvalidArgument,
                      "a value needs 1 to " + std::to_string(attach::kMaxParts) + " buffers");
    }
    for (size_t k = 0; out[i].ok() && registered && k < parts.size(); ++k) {
      if (Containing(registered_, parts[k].data, parts[k].size) == registered_.end()) {
        out[i] = NotRegistered();
      }
    }
    for (size_t k = 0; out[i].ok() && k < parts.size(); ++k) all.push_back(&parts[k]);
  }
  GpuPlan plan;
  std::string event;
  Status planned = PlanGpu(all, po.stream, &plan);
  if (planned.ok()) planned = Ready(plan, po.stream, &event);
  if (!planned.ok()) {
    for (auto& st : out) st = st.ok() ? planned : st;
    return out;
  }
  // Items of the request being built, their parts, and the staging bytes
  // they use.
  std::vector<size_t> batch;
  std::vector<std::vector<WireRef>> refs;
  uint64_t used = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    std::vector<uint8_t> p;
    ByteWriter w(&p);
    w.U32(po.replicas);
    w.U8(static_cast<uint8_t>(po.pin));
    w.U64(static_cast<uint64_t>(std::max<int64_t>(po.pin_ttl.count(), 0)));
    w.Str(po.preferred_segment);
    WriteReadiness(w, plan, event);
    w.U32(static_cast<uint32_t>(batch.size()));
    for (size_t k = 0; k < batch.size(); ++k) {
      w.Str(keys[batch[k]]);
      w.U32(static_cast<uint32_t>(refs[k].size()));
      for (const WireRef& ref : refs[k]) WriteRef(w, ref);
    }
    auto f = Call(Type::kPut, p);
    ByteReader r(f.ok() ? f.value().payload.data() : nullptr, f.ok() ? f.value().payload.size() : 0);
    const bool counted = f.ok() && r.U32() == batch.size();
    for (size_t i : batch) out[i] = !f.ok() ? f.status() : counted ? ReadStatus(r) : Status();
    if (f.ok() && (!counted || !r.ok())) {
      Status bad = Drop(Status(StatusCode::kProtocolError, "malformed Put reply from the node"));
      for (size_t i : batch) out[i] = bad;
    }
    batch.clear();
    refs.clear();
    used = 0;
  };
  auto shared = [&](const Part& part) {
    auto range = Containing(registered_, part.data, part.size);
    return range != registered_.end() && range->second.mem != nullptr ? range : registered_.end();
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i].ok()) continue;
    const std::vector<Part>& parts = values[i].parts;
    // Parts in shared memory, and exported GPU memory, go by reference; the
    // others through staging.
    uint64_t staged = 0;
    for (const Part& part : parts) {
      const bool by_ref = plan.exported.count(part.data) ? !plan.fallback
                                                          : shared(part) != registered_.end();
      if (!by_ref) staged += part.size;
    }
    if (staged > cap) {
      out[i] = Status(StatusCode::kInvalidArgument,
                      "a value of " + std::to_string(staged) + " bytes exceeds the attach "
                      "staging area of " + std::to_string(cap) +
                          " bytes; put it from AllocateBuffer memory or raise attach_staging");
      continue;
    }
    if (cap - used < staged) flush();
    std::vector<WireRef> item;
    for (const Part& part : parts) {
      if (auto e = plan.exported.find(part.data); e != plan.exported.end() && !plan.fallback) {
        item.push_back({attach::kPartGpu, 0, plan.device, e->second.first, e->second.second,
                        part.size});
        continue;
      }
      if (auto range = shared(part); range != registered_.end()) {
        item.push_back({attach::kPartBuffer, range->second.id, -1, {},
                        reinterpret_cast<uint64_t>(part.data) - range->first, part.size});
        continue;
      }
      if (plan.gpu.count(part.data)) {
        out[i] = gpu::CopyOnStreamAndWait(staging + used, part.data, part.size, po.stream);
      } else if (part.size > 0) {
        std::memcpy(staging + used, part.data, part.size);
      }
      item.push_back({attach::kPartBuffer, staging_.id, -1, {}, used, part.size});
      used += part.size;
    }
    if (!out[i].ok()) continue;
    refs.push_back(std::move(item));
    batch.push_back(i);
    if (batch.size() == attach::kMaxItems) flush();
  }
  flush();
  return out;
}

std::vector<Result<size_t>> AttachedStore::Get(std::span<const std::string> keys,
                                               std::span<Sink> sinks, bool registered,
                                               const GetOptions& options) {
  std::vector<Status> st(keys.size());
  std::vector<size_t> sizes(keys.size(), 0);
  std::lock_guard lock(mu_);
  const uint64_t cap = staging_.mem->size();
  const auto* staging = static_cast<const uint8_t*>(staging_.mem->data());
  std::vector<const Part*> all;
  for (size_t i = 0; i < keys.size(); ++i) {
    st[i] = store::CheckKey(keys[i]);
    if (st[i].ok() && sinks[i].parts.size() > attach::kMaxParts) {
      st[i] = Status(StatusCode::kInvalidArgument,
                     "at most " + std::to_string(attach::kMaxParts) + " buffers per value");
    }
    for (size_t k = 0; st[i].ok() && registered && k < sinks[i].parts.size(); ++k) {
      const Part& part = sinks[i].parts[k];
      if (Containing(registered_, part.data, part.size) == registered_.end()) {
        st[i] = NotRegistered();
      }
    }
    for (size_t k = 0; st[i].ok() && k < sinks[i].parts.size(); ++k) {
      all.push_back(&sinks[i].parts[k]);
    }
  }
  if (options.expect_prefix.size() > attach::kMaxMessage) {
    std::vector<Result<size_t>> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      out.push_back(Status(StatusCode::kInvalidArgument, "at most 4096 expected bytes"));
    }
    return out;
  }
  GpuPlan plan;
  std::string event;
  // The node writes GPU memory after the consumer stream's earlier work (R2).
  Status planned = PlanGpu(all, options.stream, &plan);
  if (planned.ok()) planned = Ready(plan, options.stream, &event);
  // Per item: its parts by reference (shared or exported GPU memory), or
  // none: packed into staging and copied out here.
  std::vector<std::vector<WireRef>> direct(keys.size());
  std::vector<size_t> pending;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i].ok() && !planned.ok()) st[i] = planned;
    if (!st[i].ok()) continue;
    bool by_ref = sinks[i].vec == nullptr;
    for (size_t k = 0; by_ref && k < sinks[i].parts.size(); ++k) {
      const Part& part = sinks[i].parts[k];
      auto range = Containing(registered_, part.data, part.size);
      if (auto e = plan.exported.find(part.data); e != plan.exported.end() && !plan.fallback) {
        direct[i].push_back({attach::kPartGpu, 0, plan.device, e->second.first, e->second.second,
                             part.size});
      } else if (range != registered_.end() && range->second.mem != nullptr) {
        direct[i].push_back({attach::kPartBuffer, range->second.id, -1, {},
                             reinterpret_cast<uint64_t>(part.data) - range->first, part.size});
      } else {
        by_ref = false;
      }
    }
    if (!by_ref || direct[i].empty()) direct[i].clear();
    pending.push_back(i);
  }
  // Rounds: packed values that found no room left in staging go again, first.
  while (!pending.empty()) {
    const size_t n = std::min<size_t>(attach::kMaxItems, pending.size());
    std::vector<size_t> batch(pending.begin(), pending.begin() + n);
    std::vector<size_t> later(pending.begin() + n, pending.end());
    std::vector<uint8_t> p;
    ByteWriter w(&p);
    w.U32(staging_.id);
    w.U64(0);
    w.U64(cap);
    WriteReadiness(w, plan, event);
    w.Str(options.expect_prefix);
    w.U32(static_cast<uint32_t>(n));
    for (size_t i : batch) {
      w.Str(keys[i]);
      w.U32(static_cast<uint32_t>(direct[i].size()));  // 0: packed
      for (const WireRef& ref : direct[i]) WriteRef(w, ref);
    }
    auto f = Call(Type::kGet, p);
    if (!f.ok()) {
      for (size_t i : batch) st[i] = f.status();
      pending = std::move(later);
      continue;
    }
    ByteReader r(f.value().payload.data(), f.value().payload.size());
    const bool counted = r.U32() == n;
    std::vector<size_t> retry;
    bool placed_any = false;  // whether some packed value took staging room
    std::vector<std::tuple<size_t, Status, uint64_t, uint64_t>> got;
    for (size_t k = 0; counted && k < n; ++k) {
      Status s = ReadStatus(r);
      const uint64_t size = r.U64(), off = r.U64();
      got.emplace_back(batch[k], std::move(s), size, off);
      if (std::get<1>(got.back()).ok() && direct[batch[k]].empty()) placed_any = true;
    }
    if (!counted || !r.ok() || r.Left() != 0) {
      Status bad = Drop(Status(StatusCode::kProtocolError, "malformed Get reply from the node"));
      for (size_t i : batch) st[i] = bad;
      pending = std::move(later);
      continue;
    }
    for (auto& [i, s, size, off] : got) {
      sizes[i] = size;
      const bool packed = direct[i].empty();
      if (!packed || (!s.ok() && s.code() != StatusCode::kOutOfRange)) {
        st[i] = s;
        continue;
      }
      if (s.code() == StatusCode::kOutOfRange) {
        if (size > cap) {
          st[i] = Status(StatusCode::kOutOfRange,
                         "a value of " + std::to_string(size) + " bytes exceeds the attach "
                         "staging area of " + std::to_string(cap) +
                             " bytes; get it into AllocateBuffer memory or raise attach_staging");
        } else if (placed_any) {
          retry.push_back(i);
        } else {
          st[i] = s;
        }
        continue;
      }
      if (off > cap || size > cap - off) {
        st[i] = Drop(Status(StatusCode::kProtocolError, "the node placed a value outside staging"));
        continue;
      }
      Sink& sink = sinks[i];
      if (sink.vec != nullptr) {
        try {
          sink.vec->assign(staging + off, staging + off + size);
        } catch (const std::bad_alloc&) {
          st[i] = Status(StatusCode::kResourceExhausted,
                         "cannot allocate " + std::to_string(size) + " bytes for the value");
        }
      } else if (const size_t room = store::TotalSize(sink.parts); room < size) {
        st[i] = Status(StatusCode::kOutOfRange, "buffer of " + std::to_string(room) +
                                                    " bytes; the value has " +
                                                    std::to_string(size));
      } else {
        // The parts in order, as the value's bytes; GPU ones on the stream.
        uint64_t done = 0;
        for (const Part& part : sink.parts) {
          const uint64_t len = std::min<uint64_t>(part.size, size - done);
          if (len > 0 && plan.gpu.count(part.data)) {
            Status c = gpu::CopyOnStreamAndWait(part.data, staging + off + done, len,
                                                options.stream);
            if (!c.ok()) st[i] = c;
          } else if (len > 0) {
            std::memcpy(part.data, staging + off + done, len);
          }
          done += len;
        }
      }
    }
    retry.insert(retry.end(), later.begin(), later.end());
    pending = std::move(retry);
  }
  std::vector<Result<size_t>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out.push_back(st[i].ok() ? Result<size_t>(sizes[i]) : Result<size_t>(st[i]));
  }
  return out;
}

std::vector<Result<ObjectLocation>> AttachedStore::Locate(std::span<const std::string> keys) {
  std::vector<Status> st;
  const std::vector<size_t> index = ValidKeys(keys, &st);
  std::vector<ObjectLocation> locs(keys.size());
  std::lock_guard lock(mu_);
  for (size_t first = 0; first < index.size(); first += attach::kMaxItems) {
    const size_t n = std::min<size_t>(attach::kMaxItems, index.size() - first);
    std::span<const size_t> part(index.data() + first, n);
    std::vector<uint8_t> p;
    ByteWriter w(&p);
    w.U32(static_cast<uint32_t>(n));
    for (size_t i : part) w.Str(keys[i]);
    auto f = Call(Type::kLocate, p);
    if (!f.ok()) {
      for (size_t i : part) st[i] = f.status();
      continue;
    }
    ByteReader r(f.value().payload.data(), f.value().payload.size());
    bool good = r.U32() == n;
    for (size_t k = 0; good && k < n; ++k) {
      st[part[k]] = ReadStatus(r);
      if (!st[part[k]].ok()) continue;
      ObjectLocation& loc = locs[part[k]];
      loc.size = r.U64();
      loc.lease = Millis(std::min<uint64_t>(r.U64(), 24ull * 3600 * 1000));
      const uint32_t reps = r.U32();
      good = r.ok() && reps <= 64;
      for (uint32_t j = 0; good && j < reps; ++j) {
        const uint32_t exts = r.U32();
        good = r.ok() && exts <= 64;
        StoreReplica rep;
        for (uint32_t e = 0; good && e < exts; ++e) {
          StoreExtent x;
          x.segment = r.Str(attach::kMaxMessage);
          x.addr = r.U64();
          x.length = r.U64();
          rep.extents.push_back(std::move(x));
          good = r.ok();
        }
        loc.replicas.push_back(std::move(rep));
      }
    }
    if (!good || !r.ok() || r.Left() != 0) {
      Status bad = Drop(Status(StatusCode::kProtocolError, "malformed Locate reply"));
      for (size_t i : part) st[i] = bad;
    }
  }
  std::vector<Result<ObjectLocation>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i].ok()) {
      out.emplace_back(std::move(locs[i]));
    } else {
      out.emplace_back(st[i]);
    }
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Store::Impl>> Store::Impl::Attach(const std::string& path,
                                                         const StoreOptions& options) {
  if (options.attach_staging == 0) {
    return Status(StatusCode::kInvalidArgument, "attach_staging must be at least one byte");
  }
  auto s = std::make_unique<AttachedStore>(path, options);
  FERRY_RETURN_IF_ERROR(s->Start());
  return std::unique_ptr<Store::Impl>(std::move(s));
}

}  // namespace ferry
