// The attached store: attaching to the host's node, the connection, and the
// calls on keys (store/client/attached.h).
#include "store/client/attached.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstring>

#include "store/rpc/framing.h"

namespace ferry::store::attached {
namespace {

// How long a call looks for its reply before it sleeps (framing.h): on the
// H200 it lifted 64 MiB puts from 0.80 to 0.88 of PCIe.
std::chrono::microseconds ReplySpin() {
  static const std::chrono::microseconds spin = framing::ReplySpin("FERRY_ATTACH_SPIN_US");
  return spin;
}

}  // namespace

Status ReadStatus(ByteReader& r) {
  const uint8_t code = r.U8();
  std::string msg = r.Str(attach::kMaxMessage);
  if (code > static_cast<uint8_t>(kLastStatusCode)) {
    return Status::ProtocolError("node sent an unknown status code");
  }
  if (code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(code), std::move(msg));
}

std::vector<size_t> ValidKeys(std::span<const std::string> keys, std::vector<Status>* st) {
  std::vector<size_t> index;
  st->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    (*st)[i] = store::CheckKey(keys[i]);
    if ((*st)[i].ok()) index.push_back(i);
  }
  return index;
}

Status AttachedStore::Connect() {
  sockaddr_un sa{};
  if (path_.empty() || path_.size() >= sizeof(sa.sun_path)) {
    return Status::InvalidArgument("bad attach socket path '" + path_ + "'");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path_.c_str(), path_.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    const int err = errno;
    close(fd);
    return Status::Unavailable("no node to attach to at " + path_ + ": " + std::strerror(err));
  }
  fd_ = fd;
  std::string mine;  // this side's nonce, with a secret
  if (key_ != nullptr) {
    auto n = auth::NewNonce();
    if (!n.ok()) return Drop(n.status());
    mine.assign(n.value().begin(), n.value().end());
  }
  std::vector<uint8_t> hello;
  ByteWriter hw(&hello);
  hw.U32(static_cast<uint32_t>(getpid()));
  if (!mine.empty()) hw.Str(mine);
  auto f = Call(Type::kHello, hello);
  if (!f.ok()) {
    (void)Drop(Status::Ok());
    return Status::Unavailable("attach to " + path_ + ": " + f.status().message());
  }
  ByteReader r(f.value().payload.data(), f.value().payload.size());
  std::string segment = r.Str(attach::kMaxMessage);
  std::string master = r.Str(attach::kMaxMessage);
  (void)r.U64();  // the node's instance, for logs
  (void)r.U32();
  // A node that holds no secret challenges with nothing (an older one sends
  // neither string).
  std::string challenge, proof;
  if (r.ok() && r.Left() > 0) {
    challenge = r.Str(auth::kNonceBytes);
    proof = r.Str(auth::kMacBytes);
  }
  if (!r.ok() || r.Left() != 0) return Drop(Status::ProtocolError("malformed Hello reply"));
  FERRY_RETURN_IF_ERROR(Authenticate(mine, challenge, proof));
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

Status AttachedStore::Authenticate(const std::string& mine, const std::string& challenge,
                                   const std::string& proof) {
  if (challenge.empty()) {
    if (key_ == nullptr) return Status::Ok();
    return Drop(
        Status::Unauthenticated("the node at " + path_ + " holds no cluster secret; refusing it"));
  }
  if (key_ == nullptr) {
    return Drop(Status::Unauthenticated("the node at " + path_ + " requires the cluster secret (" +
                                        auth::kKeyFileEnv + ")"));
  }
  auth::Mac theirs{};
  if (challenge.size() != auth::kNonceBytes || proof.size() != theirs.size()) {
    return Drop(Status::ProtocolError("malformed challenge from the node"));
  }
  std::copy(proof.begin(), proof.end(), theirs.begin());
  // The node proves the secret first: this process's memory goes to no one else.
  if (!auth::SameMac(theirs, attach::NodeProof(*key_, mine, challenge))) {
    return Drop(Status::Unauthenticated("the node at " + path_ +
                                        " did not prove the cluster secret; refusing it"));
  }
  const auth::Mac answer = attach::ClientProof(*key_, mine, challenge);
  std::vector<uint8_t> p;
  ByteWriter(&p).Str(std::string_view(reinterpret_cast<const char*>(answer.data()), answer.size()));
  auto f = Call(Type::kAuth, p);
  if (!f.ok()) return Drop(f.status());
  return Status::Ok();
}

Result<uint32_t> AttachedStore::Share(const StoreMemory& mem) {
  std::vector<uint8_t> p;
  ByteWriter(&p).U64(mem.size());
  FERRY_ASSIGN_OR_RETURN(Frame f, Call(Type::kRegister, p, mem.fd()));
  ByteReader r(f.payload.data(), f.payload.size());
  const uint32_t id = r.U32();
  if (!r.ok()) return Drop(Status::ProtocolError("malformed Register reply"));
  return id;
}

Result<Frame> AttachedStore::Call(Type type, std::span<const uint8_t> payload, int fd) {
  if (type != Type::kHello) FERRY_RETURN_IF_ERROR(EnsureConnected());
  const uint64_t id = next_id_++;
  const Deadline deadline = Deadline::After(Timeout());
  Status st = attach::Send(
      fd_, type, id,
      static_cast<uint32_t>(std::min<int64_t>(Timeout().count(), attach::kMaxDeadlineMs)),
      StatusCode::kOk, payload, deadline, fd);
  Result<Frame> reply = st;
  if (st.ok()) reply = attach::Receive(fd_, deadline, Timeout(), ReplySpin());
  if (reply.ok() && reply.value().fd >= 0) {
    close(reply.value().fd);
    reply = Status::ProtocolError("the node sent a file descriptor");
  }
  if (reply.ok() && (reply.value().id != id || reply.value().type != type)) {
    reply = Status::ProtocolError("the node answered another request");
  }
  if (!reply.ok()) {
    const Status& e = reply.status();
    if (e.code() == StatusCode::kConnectionLost) {
      return Drop(Status::ConnectionLost("the node at " + path_ + " went away (" + e.message() +
                                         "); the next call attaches again"));
    }
    return Drop(e);
  }
  FERRY_RETURN_IF_ERROR(attach::ReplyStatus(reply.value()));
  return reply;
}

std::vector<Result<ObjectLocation>> AttachedStore::Locate(std::span<const std::string> keys) {
  std::vector<ObjectLocation> locs(keys.size());
  auto read = [&](std::span<const size_t> part, ByteReader& r, std::vector<Status>& st) {
    for (size_t i : part) {
      st[i] = ReadStatus(r);
      if (!st[i].ok()) continue;
      ObjectLocation& loc = locs[i];
      loc.size = r.U64();
      loc.lease = Millis(std::min<uint64_t>(r.U64(), 24ull * 3600 * 1000));
      const uint32_t reps = r.U32();
      if (!r.ok() || reps > 64) return false;
      for (uint32_t j = 0; j < reps; ++j) {
        StoreReplica rep;
        rep.epoch = r.U64();
        const uint32_t exts = r.U32();
        if (!r.ok() || exts > 64) return false;
        for (uint32_t e = 0; e < exts; ++e) {
          StoreExtent x;
          x.segment = r.Str(attach::kMaxMessage);
          x.addr = r.U64();
          x.length = r.U64();
          if (!r.ok()) return false;
          rep.extents.push_back(std::move(x));
        }
        loc.replicas.push_back(std::move(rep));
      }
    }
    return true;
  };
  std::vector<Status> st = Batched(
      Type::kLocate, keys, [](ByteWriter&) {}, read);
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

}  // namespace ferry::store::attached

namespace ferry {

Result<std::unique_ptr<Store::Impl>> Store::Impl::Attach(const std::string& path,
                                                         const StoreOptions& options) {
  if (options.attach_staging == 0) {
    return Status::InvalidArgument("attach_staging must be at least one byte");
  }
  auto s = std::make_unique<store::attached::AttachedStore>(path, options);
  FERRY_RETURN_IF_ERROR(s->Start());
  return std::unique_ptr<Store::Impl>(std::move(s));
}

}  // namespace ferry
