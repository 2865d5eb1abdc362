// The attached store, shared by its two files: attached.cc (attaching, the
// connection, calls on keys) and attached_data.cc (puts and gets, and the GPU
// memory in them). One call at a time per Store: the connection and the
// staging area are shared by every call.
#pragma once

#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/bytes.h"
#include "gpu/interprocess.h"
#include "store/client/store_impl.h"
#include "store/rpc/attach_wire.h"
#include "store/rpc/limits.h"

namespace ferry::store::attached {

using store::Part;
using store::Sink;
using store::Source;
using store::attach::Frame;
using store::attach::Type;

// One item's status from a reply: a code and a message.
Status ReadStatus(ByteReader& r);
// Checks every key into (*st)[i]; the indices of the valid ones, to send.
std::vector<size_t> ValidKeys(std::span<const std::string> keys, std::vector<Status>* st);

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

// A call's GPU memory, classified once: the device it is on, each part's
// IPC handle and offset in its allocation, and whether some of it cannot be
// exported (then the whole call goes through staging, copied on the stream).
struct GpuPlan {
  int device = -1;
  bool fallback = false;
  std::map<const uint8_t*, std::pair<std::string, uint64_t>> exported;  // part -> handle, offset
  std::set<const uint8_t*> gpu;                                         // every GPU part
};

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
    FERRY_ASSIGN_OR_RETURN(key_, auth::LoadConfigured(opts_.auth_key_file));
    FERRY_ASSIGN_OR_RETURN(staging_.mem, StoreMemory::Create(opts_.attach_staging));
    std::lock_guard lock(mu_);
    return Connect();
  }

  const std::string& segment() const override { return segment_; }
  const std::string& master_address() const override { return master_; }

  Status RegisterBuffer(void* data, size_t size) override {
    if (data == nullptr || size == 0) {
      return Status::InvalidArgument("a buffer needs an address and a size");
    }
    std::lock_guard lock(mu_);
    const auto a = reinterpret_cast<uint64_t>(data);
    auto next = registered_.lower_bound(a);
    if ((next != registered_.end() && next->first < a + size) ||
        (next != registered_.begin() &&
         std::prev(next)->first + std::prev(next)->second.size > a)) {
      return Status::AlreadyExists("the buffer overlaps a registered one");
    }
    registered_[a] = {size, nullptr, 0};
    return Status::Ok();
  }

  Status UnregisterBuffer(void* data) override {
    std::lock_guard lock(mu_);
    auto it = registered_.find(reinterpret_cast<uint64_t>(data));
    if (it == registered_.end()) return Status::NotFound("buffer is not registered");
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
    if (!r.ok()) return Drop(Status::ProtocolError("malformed RemoveAll reply"));
    return removed;
  }

  Result<StoreStats> Stats() override {
    std::lock_guard lock(mu_);
    FERRY_ASSIGN_OR_RETURN(Frame f, Call(Type::kStats, {}));
    ByteReader r(f.payload.data(), f.payload.size());
    StoreStats s;
    s.capacity = r.U64();
    s.used = r.U64();
    s.nodes = r.U64();
    s.objects = r.U64();
    if (!r.ok()) return Drop(Status::ProtocolError("malformed Stats reply"));
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
  // The node's challenge in the Hello reply, answered: its proof checked and
  // this side's sent. Unauthenticated (and the connection dropped) unless
  // both sides hold the same secret or neither holds one. Requires mu_.
  Status Authenticate(const std::string& mine, const std::string& challenge,
                      const std::string& proof);
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
  // Sends the valid keys in parts of at most attach::kMaxItems, each payload
  // extra(writer), then the count and the keys; read(part, reader, out)
  // parses a reply's items after its count, false when malformed. Invalid
  // keys keep ValidKeys' status, a failed call's part its status, and a
  // malformed reply's part ProtocolError (the connection is dropped).
  template <typename Extra, typename Read>
  std::vector<Status> Batched(Type type, std::span<const std::string> keys, Extra&& extra,
                              Read&& read);
  Millis Timeout() const { return std::max(opts_.rpc_timeout, Millis(1)); }
  // Records this call's readiness on `stream` for the GPU memory in `plan`:
  // *event is the handle the node waits on (empty when there is none, or
  // when the fallback has already waited on the CPU).
  Status Ready(const GpuPlan& plan, void* stream, std::string* event);

  const std::string path_;
  const StoreOptions opts_;
  std::shared_ptr<const auth::Key> key_;  // the cluster secret; null: none
  std::mutex mu_;                         // one call at a time; guards everything below
  int fd_ = -1;
  uint64_t next_id_ = 1;
  std::string segment_, master_;
  Staging staging_;
  std::map<uint64_t, Range> registered_;                  // by address
  std::map<int, std::unique_ptr<gpu::IpcEvent>> events_;  // by device, made on first use
};

template <typename Extra, typename Read>
inline std::vector<Status> AttachedStore::Batched(Type type, std::span<const std::string> keys,
                                                  Extra&& extra, Read&& read) {
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
    if (!f.ok()) {
      for (size_t i : part) out[i] = f.status();
      continue;
    }
    ByteReader r(f.value().payload.data(), f.value().payload.size());
    const bool good = r.U32() == n && read(part, r, out) && r.ok() && r.Left() == 0;
    if (!good) {
      Status bad = Drop(Status::ProtocolError("malformed reply from the node"));
      for (size_t i : part) out[i] = bad;
    }
  }
  return out;
}

template <typename Extra>
inline std::vector<Status> AttachedStore::KeyOp(Type type, std::span<const std::string> keys,
                                                Extra&& extra) {
  return Batched(type, keys, std::forward<Extra>(extra),
                 [](std::span<const size_t> part, ByteReader& r, std::vector<Status>& out) {
                   for (size_t i : part) out[i] = ReadStatus(r);
                   return true;
                 });
}

}  // namespace ferry::store::attached
