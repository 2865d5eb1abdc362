#include "store/node/attach_session.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "common/bytes.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "gpu/gpu.h"
#include "gpu/interprocess.h"
#include "store/node/core.h"
#include "store/rpc/attach_wire.h"

namespace ferry::store {

// A client's memfd, mapped here and registered with the node's engine until
// the last operation holding it ends.
struct Mapping {
  StoreCore& core;
  uint8_t* data;
  size_t size;
  ~Mapping() {
    (void)core.Unregister(data);
    munmap(data, size);
  }
};

namespace {

using attach::Frame;
using attach::Type;

Status Bad(const std::string& what) { return Status::InvalidArgument(what); }

// Maps a client's memfd of `size` bytes: it must be a memfd that cannot
// shrink under the mapping, and at least that large.
Result<uint8_t*> MapClientMemfd(int fd, uint64_t size) {
  if (size == 0 || size > (1ull << 40)) return Bad("a buffer needs 1 byte to 1 TiB");
  struct stat sb {};
  if (fstat(fd, &sb) != 0) return Status::FromErrno(errno, "fstat");
  const int seals = fcntl(fd, F_GET_SEALS);
  if (!S_ISREG(sb.st_mode) || seals < 0) return Bad("the file descriptor is not a memfd");
  if ((seals & F_SEAL_SHRINK) == 0) {
    return Bad("the memfd is not sealed against shrinking (F_SEAL_SHRINK)");
  }
  if (static_cast<uint64_t>(sb.st_size) < size) {
    return Bad("the memfd has " + std::to_string(sb.st_size) + " bytes, not the " +
               std::to_string(size) + " claimed");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap of a client's memfd");
  return static_cast<uint8_t*>(p);
}

void PutStatus(ByteWriter& w, const Status& st) {
  w.U8(static_cast<uint8_t>(st.code()));
  w.Str(st.ok() ? std::string_view()
                : std::string_view(st.message()).substr(0, attach::kMaxMessage));
}

// Imports kept per client; past this, the cache starts afresh.
constexpr size_t kMaxImports = 256;

Status CountOf(ByteReader& r, uint32_t* n) {
  *n = r.U32();
  if (!r.ok() || *n == 0 || *n > attach::kMaxItems) {
    return Status::ProtocolError("a request needs 1 to " + std::to_string(attach::kMaxItems) +
                                 " items");
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> AttachSession::Keys(ByteReader& r, uint32_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.Str(Store::kMaxKeyBytes));
  return keys;
}

Status AttachSession::ReadParts(ByteReader& r, uint32_t min_parts, int gpu_device,
                                std::vector<Part>* parts) {
  const uint32_t n = r.U32();
  if (!r.ok() || n < min_parts || n > attach::kMaxParts) {
    return Status::ProtocolError("an item needs " + std::to_string(min_parts) + " to " +
                                 std::to_string(attach::kMaxParts) + " parts");
  }
  Status st;
  for (uint32_t k = 0; k < n && r.ok(); ++k) {
    const uint8_t kind = r.U8();
    if (kind == attach::kPartBuffer) {
      const uint32_t id = r.U32();
      const uint64_t off = r.U64(), len = r.U64();
      uint8_t* p = Resolve(id, off, len);
      if (p == nullptr) st = Bad("the range is not inside a buffer registered with the node");
      parts->push_back({p, len});
    } else if (kind == attach::kPartGpu) {
      const int device = static_cast<int>(r.U32());
      std::string handle = r.Str(gpu::kIpcHandleBytes);
      const uint64_t off = r.U64(), len = r.U64();
      if (!r.ok()) break;
      Result<uint8_t*> p = Bad("GPU memory on device " + std::to_string(device) +
                               ", but the request's device is " + std::to_string(gpu_device));
      if (device == gpu_device) p = Import(handle, device, off, len);
      if (!p.ok()) st = p.status();
      parts->push_back({p.ok() ? p.value() : nullptr, len});
    } else {
      return Status::ProtocolError("unknown part kind " + std::to_string(kind));
    }
  }
  return st;
}

Status AttachSession::ReadReadiness(ByteReader& r, int* device, void** stream) {
  *device = r.I32();
  const std::string event = r.Str(gpu::kIpcHandleBytes);
  *stream = nullptr;
  if (!r.ok() || (!event.empty() && event.size() != gpu::kIpcHandleBytes) ||
      (*device < 0 && !event.empty())) {
    return Status::ProtocolError("malformed GPU readiness");
  }
  if (*device < 0) return Status::Ok();
  if (*device >= gpu::DeviceCount()) return Bad("no GPU " + std::to_string(*device) + " here");
  auto& s = streams_[*device];
  if (s == nullptr) {
    // Made once per client and device, when its first GPU request comes.
    FERRY_ASSIGN_OR_RETURN(s, gpu::IpcStream::Create(*device));
  }
  if (!event.empty()) FERRY_RETURN_IF_ERROR(s->WaitPeerEvent(event));
  *stream = s->stream();
  return Status::Ok();
}

Result<uint8_t*> AttachSession::Import(const std::string& handle, int device, uint64_t off,
                                       uint64_t len) {
  auto it = imports_.find(handle);
  if (it == imports_.end()) {
    if (imports_.size() >= kMaxImports) {
      for (auto& [h, imp] : imports_) gpu::CloseIpc(imp.base, imp.device);
      imports_.clear();
    }
    // Opening can synchronize the device: once per allocation and client.
    FERRY_ASSIGN_OR_RETURN(void* base, gpu::OpenIpc(handle, device));
    const gpu::MemoryInfo info = gpu::Classify(base);
    it = imports_.emplace(handle, Imported{static_cast<uint8_t*>(base), device, info.alloc_size})
             .first;
  }
  const Imported& imp = it->second;
  if (off > imp.size || len > imp.size - off) {
    return Bad("the range is outside the client's GPU allocation");
  }
  return imp.base + off;
}

uint8_t* AttachSession::Resolve(uint32_t id, uint64_t off, uint64_t len) const {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return nullptr;
  const Mapping& m = *it->second;
  if (off > m.size || len > m.size - off) return nullptr;
  return m.data + off;
}

void AttachSession::Run(bool admitted, const std::string& refusal) {
  // The first frame must be a Hello, within the handshake timeout.
  auto hello = attach::Receive(fd_, Deadline::After(o_.handshake_timeout), o_.frame_timeout);
  if (!hello.ok() || hello.value().type != Type::kHello || hello.value().code != StatusCode::kOk) {
    if (hello.ok() && hello.value().fd >= 0) close(hello.value().fd);
    FERRY_LOG_WARN("attach {}: closing a client without a valid Hello: {}", o_.path,
                   hello.ok() ? "wrong first message" : hello.status().ToString());
    return;
  }
  if (hello.value().fd >= 0) close(hello.value().fd);
  const Deadline send_by = Deadline::After(o_.frame_timeout);
  if (!admitted) {
    (void)attach::Send(fd_, Type::kHello, hello.value().id, 0, StatusCode::kUnavailable,
                       attach::MessagePayload(Status::Unavailable(refusal)), send_by);
    return;
  }
  // pid u32, then a client with a secret sends its nonce.
  ByteReader hr(hello.value().payload.data(), hello.value().payload.size());
  (void)hr.U32();
  const std::string client_nonce = hr.Left() > 0 ? hr.Str(auth::kNonceBytes) : std::string();
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Str(core_.engine().name());
  w.Str(o_.master);
  w.U64(instance_);
  w.U32(attach::kMaxPayload);
  std::string nonce;
  Status st = Status::ProtocolError("malformed Hello");
  if (hr.ok() && hr.Left() == 0 &&
      (client_nonce.empty() || client_nonce.size() == auth::kNonceBytes)) {
    st = Challenge(client_nonce, w, &nonce);
  }
  if (!st.ok()) {
    FERRY_LOG_WARN("attach {}: closing {}: {}", o_.path, peer_, st.ToString());
    (void)attach::Send(fd_, Type::kHello, hello.value().id, 0, st.code(),
                       attach::MessagePayload(st), send_by);
    return;
  }
  if (!attach::Send(fd_, Type::kHello, hello.value().id, 0, StatusCode::kOk, out, send_by).ok()) {
    return;
  }
  bool authed = o_.key == nullptr;
  for (;;) {
    // An attached client may be idle for as long as it likes.
    auto f = attach::Receive(fd_, Deadline(), o_.frame_timeout);
    if (!f.ok()) {
      if (f.status().code() != StatusCode::kConnectionLost) {
        FERRY_LOG_WARN("attach {}: closing a client: {}", o_.path, f.status().ToString());
      }
      return;
    }
    const Frame& req = f.value();
    if (!authed) {
      if (req.fd >= 0) close(req.fd);
      if (!Authenticated(req, client_nonce, nonce)) return;
      authed = true;
      continue;
    }
    std::vector<uint8_t> reply;
    Status st = Status::ProtocolError("a request carries status code 0");
    if (req.code == StatusCode::kOk) st = Handle(req, &reply);
    if (req.fd >= 0) close(req.fd);  // a Register has taken its own copy
    if (!st.ok()) reply = attach::MessagePayload(st);
    Status sent =
        attach::Send(fd_, req.type, req.id, 0, st.code(), reply, Deadline::After(o_.frame_timeout));
    if (st.code() == StatusCode::kProtocolError) {
      FERRY_LOG_WARN("attach {}: closing a client: {}", o_.path, st.ToString());
      return;
    }
    if (!sent.ok()) return;
  }
}

Status AttachSession::Challenge(const std::string& client_nonce, ByteWriter& w,
                                std::string* nonce) {
  std::string proof;
  if (o_.key != nullptr) {
    FERRY_ASSIGN_OR_RETURN(auth::Nonce n, auth::NewNonce());
    nonce->assign(n.begin(), n.end());
    if (!client_nonce.empty()) {
      const auth::Mac mac = attach::NodeProof(*o_.key, client_nonce, *nonce);
      proof.assign(mac.begin(), mac.end());
    }
  }
  w.Str(*nonce);
  w.Str(proof);
  return Status::Ok();
}

bool AttachSession::Authenticated(const Frame& req, const std::string& client_nonce,
                                  const std::string& nonce) {
  std::string why =
      "a request before proving the cluster secret (" + std::string(auth::kKeyFileEnv) + ")";
  if (req.type == Type::kAuth && req.code == StatusCode::kOk) {
    ByteReader r(req.payload.data(), req.payload.size());
    const std::string proof = r.Str(auth::kMacBytes);
    auth::Mac got{};
    const bool well_formed = r.ok() && r.Left() == 0 && proof.size() == got.size();
    if (well_formed) std::copy(proof.begin(), proof.end(), got.begin());
    if (well_formed && !client_nonce.empty() &&
        auth::SameMac(got, attach::ClientProof(*o_.key, client_nonce, nonce))) {
      return attach::Send(fd_, req.type, req.id, 0, StatusCode::kOk, {},
                          Deadline::After(o_.frame_timeout))
          .ok();
    }
    why = client_nonce.empty() ? "an Auth without a nonce in its Hello"
                               : "a wrong proof (another cluster secret, or a replayed one)";
  }
  refusals_.Add(peer_, why);
  (void)attach::Send(fd_, req.type, req.id, 0, StatusCode::kUnauthenticated,
                     attach::MessagePayload(Status::Unauthenticated("this node refuses " + why)),
                     Deadline::After(o_.frame_timeout));
  shutdown(fd_, SHUT_RDWR);  // at once: the fd itself is closed when the session is reaped
  return false;
}

Status AttachSession::Handle(const Frame& f, std::vector<uint8_t>* reply) {
  if (f.fd >= 0 && f.type != Type::kRegister) {
    return Status::ProtocolError("a file descriptor came with a non-Register frame");
  }
  if (f.deadline_ms == 0) return Status::ProtocolError("a request needs a deadline");
  ByteReader r(f.payload.data(), f.payload.size());
  ByteWriter w(reply);
  Status st;
  switch (f.type) {
    case Type::kRegister: st = Register(f.fd, r, w); break;
    case Type::kUnregister: {
      const uint32_t id = r.U32();
      if (r.ok() && buffers_.erase(id) == 0) st = Status::NotFound("unknown buffer");
      break;
    }
    case Type::kPut: st = Put(r, w); break;
    case Type::kGet: st = Get(r, w); break;
    case Type::kExists:
    case Type::kRemove:
    case Type::kPin: st = KeyOp(f.type, r, w); break;
    case Type::kLocate: st = Locate(r, w); break;
    case Type::kStats: {
      FERRY_ASSIGN_OR_RETURN(StoreStats s, core_.Stats());
      w.U64(s.capacity);
      w.U64(s.used);
      w.U64(s.nodes);
      w.U64(s.objects);
      break;
    }
    case Type::kRemoveAll: {
      const uint8_t force = r.U8();
      if (!r.ok()) break;
      FERRY_ASSIGN_OR_RETURN(uint64_t removed, core_.RemoveAll(force != 0));
      w.U64(removed);
      break;
    }
    case Type::kHello: return Status::ProtocolError("a second Hello");
    case Type::kAuth:
      return Status::ProtocolError(o_.key ? "a second Auth"
                                          : "an Auth, but this node has no secret");
  }
  if (st.code() != StatusCode::kProtocolError && (!r.ok() || r.Left() != 0)) {
    return Status::ProtocolError("malformed attach request payload");
  }
  return st;
}

Status AttachSession::Register(int fd, ByteReader& r, ByteWriter& w) {
  const uint64_t size = r.U64();
  if (!r.ok() || r.Left() != 0) return Status::ProtocolError("malformed Register");
  if (fd < 0) return Bad("a Register request needs a memfd (SCM_RIGHTS)");
  if (buffers_.size() >= o_.max_buffers_per_client) {
    return Status::ResourceExhausted("at most " + std::to_string(o_.max_buffers_per_client) +
                                     " buffers per client");
  }
  FERRY_ASSIGN_OR_RETURN(uint8_t * p, MapClientMemfd(fd, size));
  if (Status st = core_.Register(p, size); !st.ok()) {
    munmap(p, size);
    return st;
  }
  const uint32_t id = next_id_++;
  buffers_[id] = std::shared_ptr<Mapping>(new Mapping{core_, p, size});
  w.U32(id);
  return Status::Ok();
}

Status AttachSession::Put(ByteReader& r, ByteWriter& w) {
  PutOptions po;
  po.replicas = r.U32();
  const uint8_t pin = r.U8();
  po.pin_ttl = Millis(std::min<uint64_t>(r.U64(), 365ull * 24 * 3600 * 1000));
  po.preferred_segment = r.Str(attach::kMaxMessage);
  int device = -1;
  FERRY_RETURN_IF_ERROR(ReadReadiness(r, &device, &po.stream));
  uint32_t n = 0;
  FERRY_RETURN_IF_ERROR(CountOf(r, &n));
  if (pin > static_cast<uint8_t>(StorePin::kHard)) return Bad("unknown pin kind");
  po.pin = static_cast<StorePin>(pin);
  std::vector<std::string> keys(n);
  std::vector<Source> src(n);
  std::vector<Status> pre(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    keys[i] = r.Str(Store::kMaxKeyBytes);
    pre[i] = ReadParts(r, 1, device, &src[i].parts);
    if (pre[i].code() == StatusCode::kProtocolError) return pre[i];
  }
  if (!r.ok() || r.Left() != 0) return Status::ProtocolError("malformed Put");
  auto out = core_.Put(keys, src, po, std::move(pre), /*own_stream=*/true);
  w.U32(n);
  for (const Status& st : out) PutStatus(w, st);
  return Status::Ok();
}

Status AttachSession::Get(ByteReader& r, ByteWriter& w) {
  const uint32_t pack_id = r.U32();
  const uint64_t pack_off = r.U64(), pack_cap = r.U64();
  int device = -1;
  void* stream = nullptr;
  FERRY_RETURN_IF_ERROR(ReadReadiness(r, &device, &stream));
  const std::string expect = r.Str(attach::kMaxMessage);
  uint32_t n = 0;
  FERRY_RETURN_IF_ERROR(CountOf(r, &n));
  Pack pack;
  if (pack_cap > 0) {
    pack.base = Resolve(pack_id, pack_off, pack_cap);
    if (pack.base == nullptr) return Bad("the pack region is not inside a registered buffer");
    pack.cap = pack_cap;
  }
  std::vector<std::string> keys(n);
  std::vector<Sink> sinks(n);
  std::vector<Status> bad(n);
  std::vector<bool> packed(n, false);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    keys[i] = r.Str(Store::kMaxKeyBytes);
    // No parts: packed into the request's pack region.
    bad[i] = ReadParts(r, 0, device, &sinks[i].parts);
    if (bad[i].code() == StatusCode::kProtocolError) return bad[i];
    if (bad[i].ok() && sinks[i].parts.empty()) {
      if (pack.base == nullptr) bad[i] = Bad("a packed item, but no pack region");
      sinks[i].pack = &pack;
      packed[i] = true;
    }
    if (!bad[i].ok()) sinks[i] = Sink{};
  }
  if (!r.ok() || r.Left() != 0) return Status::ProtocolError("malformed Get");
  auto out = core_.Get(keys, sinks, stream, expect, /*own_stream=*/true);
  w.U32(n);
  for (uint32_t i = 0; i < n; ++i) {
    PutStatus(w, bad[i].ok() ? out[i].status() : bad[i]);
    w.U64(sinks[i].size);
    // Where a packed value went, as an offset in the pack buffer.
    w.U64(packed[i] && bad[i].ok() && out[i].ok()
              ? pack_off + static_cast<uint64_t>(sinks[i].parts[0].data - pack.base)
              : 0);
  }
  return Status::Ok();
}

Status AttachSession::KeyOp(Type type, ByteReader& r, ByteWriter& w) {
  uint8_t flag = 0;
  uint64_t ttl = 0;
  if (type == Type::kRemove) flag = r.U8();
  if (type == Type::kPin) {
    flag = r.U8();
    ttl = std::min<uint64_t>(r.U64(), 365ull * 24 * 3600 * 1000);
  }
  uint32_t n = 0;
  FERRY_RETURN_IF_ERROR(CountOf(r, &n));
  auto keys = Keys(r, n);
  if (!r.ok() || r.Left() != 0) return Status::ProtocolError("malformed request");
  std::vector<Status> out;
  if (type == Type::kExists) {
    out = core_.Exists(keys);
  } else if (type == Type::kRemove) {
    out = core_.Remove(keys, flag != 0);
  } else {
    if (flag > static_cast<uint8_t>(StorePin::kHard)) return Bad("unknown pin kind");
    out = core_.Pin(keys, static_cast<StorePin>(flag), Millis(ttl));
  }
  w.U32(n);
  for (const Status& st : out) PutStatus(w, st);
  return Status::Ok();
}

Status AttachSession::Locate(ByteReader& r, ByteWriter& w) {
  uint32_t n = 0;
  FERRY_RETURN_IF_ERROR(CountOf(r, &n));
  auto keys = Keys(r, n);
  if (!r.ok() || r.Left() != 0) return Status::ProtocolError("malformed Locate");
  auto out = core_.Locate(keys);
  w.U32(n);
  for (const auto& loc : out) {
    PutStatus(w, loc.status());
    if (!loc.ok()) continue;
    const ObjectLocation& l = loc.value();
    w.U64(l.size);
    w.U64(static_cast<uint64_t>(l.lease.count()));
    w.U32(static_cast<uint32_t>(l.replicas.size()));
    for (const auto& rep : l.replicas) {
      w.U64(rep.epoch);
      w.U32(static_cast<uint32_t>(rep.extents.size()));
      for (const auto& e : rep.extents) {
        w.Str(e.segment);
        w.U64(e.addr);
        w.U64(e.length);
      }
    }
  }
  return Status::Ok();
}

}  // namespace ferry::store
