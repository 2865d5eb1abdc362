#include "store/rpc/master_client.h"

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "common/env.h"
#include "coord/etcd_client.h"
#include "coord/etcd_url.h"
#include "proto/store.grpc.pb.h"
#include "store/rpc/call_auth.h"
#include "store/rpc/catalog_wire.h"
#include "store/rpc/leader.h"
#include "store/rpc/limits.h"
#include "store/rpc/master_socket.h"
#include "store/rpc/master_wire.h"
#include "store/rpc/proto_util.h"

namespace ferry::store {
namespace {

namespace pb = ::ferry::store::v1;

// Most extents one replica may have, as the master's allocator promises.
constexpr int kMaxReplicaExtents = static_cast<int>(kMaxExtents);
constexpr int kMaxReplicas = 64;

Status FromGrpc(const grpc::Status& st, const char* call) {
  if (st.ok()) return Status::Ok();
  return Status(CodeFromGrpc(st.error_code()),
                std::string("master ") + call + ": " + st.error_message());
}

// Replicas from the master, checked: extents are non-empty and sum to `size`.
Result<std::vector<StoreReplica>> ReadReplicas(
    const google::protobuf::RepeatedPtrField<pb::Replica>& in, uint64_t size) {
  if (in.empty() || in.size() > kMaxReplicas) {
    return Status::ProtocolError("master sent no or too many replicas");
  }
  std::vector<StoreReplica> out;
  for (const auto& r : in) {
    if (r.extents().empty() || r.extents_size() > kMaxReplicaExtents) {
      return Status::ProtocolError("master sent a replica with bad extents");
    }
    if (r.epoch() == 0) return Status::ProtocolError("master sent a replica without an epoch");
    StoreReplica rep;
    rep.epoch = r.epoch();
    uint64_t total = 0;
    for (const auto& e : r.extents()) {
      if (e.segment().empty() || e.length() == 0 || e.addr() == 0 ||
          e.addr() + e.length() < e.addr() || e.length() > size) {
        return Status::ProtocolError("master sent a malformed extent");
      }
      total += e.length();
      rep.extents.push_back({e.segment(), e.addr(), e.length()});
    }
    if (total != size) {
      return Status::ProtocolError("master sent extents that do not cover the value");
    }
    out.push_back(std::move(rep));
  }
  return out;
}

// An answered item's status and, when OK, its replicas, checked against `size`.
template <typename Answer>
Status ReadItem(const Answer& r, uint64_t size, std::vector<StoreReplica>* replicas) {
  FERRY_RETURN_IF_ERROR(FromProto(r.status()));
  FERRY_ASSIGN_OR_RETURN(*replicas, ReadReplicas(r.replicas(), size));
  return Status::Ok();
}

// A put timeout or lease from the master, capped at a day so that no deadline
// built from it overflows.
Millis Term(uint64_t ms) { return Millis(std::min<uint64_t>(ms, 24ull * 3600 * 1000)); }

// ProtocolError unless the master answered `n` items.
Status CheckCount(int answered, size_t n) {
  if (static_cast<size_t>(answered) != n) {
    return Status::ProtocolError("master answered a different number of items");
  }
  return Status::Ok();
}

// A call's context: its deadline and, with a secret, its token.
Result<std::unique_ptr<grpc::ClientContext>> Context(const auth::Key* key, Millis timeout,
                                                     const char* method) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  if (key != nullptr) {
    FERRY_ASSIGN_OR_RETURN(std::string token, MakeCallToken(*key, method));
    ctx->AddMetadata(kTokenHeader, token);
  }
  return ctx;
}

// A call by all of its names: the stub's method, the service's, and its
// socket type (0: gRPC only).
template <typename Req, typename Resp>
struct Rpc {
  grpc::Status (pb::Master::Stub::*remote)(grpc::ClientContext*, const Req&, Resp*);
  grpc::Status (pb::Master::Service::*local)(grpc::ServerContext*, const Req*, Resp*);
  const char* name;
  uint16_t socket;
};
template <typename Req, typename Resp>
Rpc(grpc::Status (pb::Master::Stub::*)(grpc::ClientContext*, const Req&, Resp*),
    grpc::Status (pb::Master::Service::*)(grpc::ServerContext*, const Req*, Resp*), const char*,
    uint16_t) -> Rpc<Req, Resp>;
#define FERRY_RPC(method)                                             \
  Rpc {                                                               \
    &pb::Master::Stub::method, &pb::Master::Service::method, #method, \
        master_wire::TypeFor(#method)                                 \
  }

// How long a caller looks for a socket call's reply before it sleeps.
std::chrono::microseconds SocketSpin() {
  static const std::chrono::microseconds spin = framing::ReplySpin("FERRY_MASTER_SPIN_US");
  return spin;
}

// How soon a master whose socket could not be had is asked for it again.
constexpr Millis kAskAgain{1000};

// The host of "host:port" or "[v6]:port".
std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

template <typename Resp>
Result<std::vector<Status>> Statuses(const Resp& resp, size_t n) {
  FERRY_RETURN_IF_ERROR(CheckCount(resp.results_size(), n));
  std::vector<Status> out;
  for (const auto& s : resp.results()) out.push_back(FromProto(s));
  return out;
}

}  // namespace

std::unique_ptr<pb::Master::Stub> NewStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  return pb::Master::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

class MasterClient::Impl {
 public:
  // The stub of the master to call: the fixed one, or the cluster's leader
  // as etcd says now (a new channel when it changed). Unavailable while no
  // master leads, after waiting up to the call's timeout for one.
  Result<std::shared_ptr<pb::Master::Stub>> Stub() const {
    if (resolver == nullptr) return stub;  // fixed at Connect: no lock on the call path
    std::lock_guard lk(mu);
    FERRY_ASSIGN_OR_RETURN(LeaderInfo leader, resolver->Leader(timeout));
    if (leader.address != current) {
      stub = NewStub(leader.address);
      current = leader.address;
    }
    return stub;
  }
  // A call's outcome; an unreachable master makes the resolver look again.
  Status Done(const grpc::Status& st, const char* call) const {
    Status out = FromGrpc(st, call);
    if (out.code() == StatusCode::kUnavailable && resolver != nullptr) resolver->Refresh();
    return out;
  }
  // Runs `rpc`: straight into the in-process service when there is one (on
  // this thread, with no token: the caller shares its address space), else
  // over gRPC with a deadline of the timeout plus `extra`.
  template <typename Req, typename Resp>
  Status Call(const Rpc<Req, Resp>& rpc, const Req& req, Resp* resp,
              Millis extra = Millis(0)) const {
    if (local != nullptr) {
      grpc::ServerContext server_ctx;
      return FromGrpc((local->*rpc.local)(&server_ctx, &req, resp), rpc.name);
    }
    FERRY_ASSIGN_OR_RETURN(auto s, Stub());
    if (rpc.socket != 0) {
      if (std::shared_ptr<MasterSocket> sock = Socket(*s)) {
        bool unsent = false;
        Status st = SocketCall(*sock, rpc.socket, rpc.name, req, resp, timeout + extra, &unsent);
        if (!unsent) return st;
        AskAgainSoon();  // a restarted master serves on another port
      }
    }
    FERRY_ASSIGN_OR_RETURN(auto ctx, store::Context(key.get(), timeout + extra, rpc.name));
    return Done(((*s).*rpc.remote)(ctx.get(), req, resp), rpc.name);
  }
  // `rpc` over the master's socket. With `*unsent`, the request never left
  // and may go by gRPC.
  template <typename Req, typename Resp>
  Status SocketCall(MasterSocket& sock, uint16_t type, const char* name, const Req& req, Resp* resp,
                    Millis call_timeout, bool* unsent) const {
    std::string token;
    if (key != nullptr) {
      FERRY_ASSIGN_OR_RETURN(token, MakeCallToken(*key, name));
    }
    std::string body;
    req.SerializeToString(&body);
    FERRY_ASSIGN_OR_RETURN(std::vector<uint8_t> payload, master_wire::EncodeRequest(token, body));
    auto reply = sock.Call(type, payload, call_timeout, unsent);
    if (!reply.ok()) {
      if (reply.status().code() == StatusCode::kUnavailable && resolver != nullptr) {
        resolver->Refresh();
      }
      return Status(reply.status().code(),
                    std::string("master ") + name + ": " + reply.status().message());
    }
    const framing::Frame& f = reply.value();
    if (f.code != StatusCode::kOk) {
      return Status(f.code,
                    std::string("master ") + name + ": " + master_wire::ReplyMessage(f.payload));
    }
    if (!resp->ParseFromArray(f.payload.data(), static_cast<int>(f.payload.size()))) {
      return Status::ProtocolError(std::string("master ") + name + ": malformed reply");
    }
    return Status::Ok();
  }
  // The socket of the master behind `stub`, asked for with Hello the first
  // time; null when it serves none (or FERRY_MASTER_SOCKET=0).
  std::shared_ptr<MasterSocket> Socket(pb::Master::Stub& stub) const {
    std::lock_guard lk(socket_mu);
    if (!use_socket) return nullptr;
    const std::string addr = resolver == nullptr ? current : CurrentAddress();
    if (socket_for == addr && Clock::now() < socket_retry) return socket;
    socket_for = addr;
    socket.reset();
    pb::HelloRequest req;
    pb::HelloResponse resp;
    socket_retry = Clock::now() + kAskAgain;
    auto ctx = store::Context(key.get(), std::min(timeout, kAskAgain), "Hello");
    if (!ctx.ok()) return nullptr;
    grpc::Status st = stub.Hello(ctx.value().get(), req, &resp);
    // An older master has no Hello: gRPC only, for as long as it stays; an
    // unreachable one is asked again a second later.
    if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        socket_retry = Clock::time_point::max();
      }
      return nullptr;
    }
    socket_retry = Clock::time_point::max();
    if (resp.socket_port() == 0 || resp.socket_port() > 65535 ||
        resp.socket_version() != master_wire::kVersion) {
      return nullptr;
    }
    socket = std::make_shared<MasterSocket>(HostOf(addr), static_cast<uint16_t>(resp.socket_port()),
                                            SocketSpin());
    return socket;
  }
  void AskAgainSoon() const {
    std::lock_guard lk(socket_mu);
    socket_retry = std::min(socket_retry, Clock::now() + kAskAgain);
  }
  std::string CurrentAddress() const {
    std::lock_guard lk(mu);
    return current;
  }
  Millis timeout;
  std::shared_ptr<const auth::Key> key;      // null: no secret
  std::shared_ptr<TermFence> fence;          // never null
  std::unique_ptr<LeaderResolver> resolver;  // etcd://: follows the leader; else null
  mutable std::mutex mu;
  // Guarded by mu when following a leader; else set once at Connect.
  mutable std::shared_ptr<pb::Master::Stub> stub;
  mutable std::string current;           // the stub's address; guarded by mu
  pb::Master::Service* local = nullptr;  // in-process: called directly, not through stub
  bool use_socket = true;                // FERRY_MASTER_SOCKET=0: gRPC only
  mutable std::mutex socket_mu;
  mutable std::shared_ptr<MasterSocket> socket;  // guarded by socket_mu; null: none
  mutable std::string socket_for;                // guarded by socket_mu: its master's address
  mutable Clock::time_point socket_retry;        // guarded by socket_mu: when to ask again
};

const TermFence& MasterClient::fence() const { return *impl_->fence; }

MasterClient::MasterClient(std::string address, std::unique_ptr<Impl> impl)
    : address_(std::move(address)), impl_(std::move(impl)) {}
MasterClient::~MasterClient() = default;

Result<std::unique_ptr<MasterClient>> MasterClient::Connect(const std::string& address,
                                                            Millis rpc_timeout,
                                                            std::shared_ptr<const auth::Key> key,
                                                            std::shared_ptr<TermFence> fence) {
  auto impl = std::make_unique<Impl>();
  if (coord::IsEtcdUrl(address)) {
    FERRY_ASSIGN_OR_RETURN(coord::EtcdUrl url, coord::ParseEtcdUrl(address));
    FERRY_ASSIGN_OR_RETURN(auto etcd, coord::EtcdClient::Create({url.endpoints, rpc_timeout}));
    // Reachable now, or the caller hears it at once rather than per call.
    auto probe = etcd->Get(LeaderKey(url.cluster));
    if (!probe.ok()) {
      return Status(probe.status().code(),
                    "master " + address + ": etcd: " + probe.status().message());
    }
    FERRY_ASSIGN_OR_RETURN(impl->resolver, LeaderResolver::Start(std::move(etcd), url.cluster));
  } else if (address.empty() || address.find(':') == std::string::npos) {
    return Status::InvalidArgument("master address must be host:port or etcd://ENDPOINTS/CLUSTER");
  } else {
    impl->stub = NewStub(address);
    impl->current = address;
  }
  impl->timeout = rpc_timeout;
  impl->use_socket = env::Get("FERRY_MASTER_SOCKET").value_or("") != "0";
  impl->key = std::move(key);
  impl->fence = fence ? std::move(fence) : std::make_shared<TermFence>();
  return std::unique_ptr<MasterClient>(new MasterClient(address, std::move(impl)));
}

Result<std::unique_ptr<MasterClient>> MasterClient::Connect(const std::string& address,
                                                            grpc::Service* local,
                                                            Millis rpc_timeout,
                                                            std::shared_ptr<const auth::Key> key,
                                                            std::shared_ptr<TermFence> fence) {
  if (env::Get("FERRY_IN_PROCESS_MASTER").value_or("") == "0") {
    return Connect(address, rpc_timeout, std::move(key), std::move(fence));
  }
  auto* service = dynamic_cast<pb::Master::Service*>(local);
  if (service == nullptr) return Status::InvalidArgument("not a master service");
  auto impl = std::make_unique<Impl>();
  impl->local = service;
  impl->current = address;
  impl->fence = fence ? std::move(fence) : std::make_shared<TermFence>();
  return std::unique_ptr<MasterClient>(new MasterClient(address, std::move(impl)));
}

Result<MountReply> MasterClient::Mount(const NodeMount& m) {
  pb::MountRequest req;
  req.set_node(m.node);
  req.set_epoch(m.epoch);
  req.set_resumed(m.resumed);
  for (auto [base, size] : m.regions) {
    auto* r = req.add_regions();
    r->set_base(base);
    r->set_size(size);
  }
  for (const CatalogEntry& e : m.catalog) ToProto(e, req.add_catalog());
  pb::MountResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call(FERRY_RPC(Mount), req, &resp));
  FERRY_RETURN_IF_ERROR(impl_->fence->Observe(resp.term()));
  FERRY_RETURN_IF_ERROR(FromProto(resp.status()));
  return MountReply{Millis(std::max<uint64_t>(resp.node_ttl_ms(), 10)), resp.term(),
                    resp.recovered(), resp.catalog_sync()};
}

Result<std::vector<CatalogChange>> MasterClient::Heartbeat(const std::string& node, uint64_t acked,
                                                           bool ack_only, Millis hold) {
  pb::NodeRequest req;
  req.set_node(node);
  req.set_acked(acked);
  req.set_ack_only(ack_only);
  req.set_hold_ms(static_cast<uint64_t>(std::max<int64_t>(hold.count(), 0)));
  pb::NodeResponse resp;
  // A held call may take its hold on top of the usual time.
  FERRY_RETURN_IF_ERROR(impl_->Call(FERRY_RPC(Heartbeat), req, &resp, hold));
  FERRY_RETURN_IF_ERROR(impl_->fence->Observe(resp.term()));
  FERRY_RETURN_IF_ERROR(FromProto(resp.status()));
  std::vector<CatalogChange> out;
  out.reserve(static_cast<size_t>(resp.changes_size()));
  for (const auto& c : resp.changes()) {
    if (c.seq() != acked + 1 + out.size()) {
      return Status::ProtocolError("master sent catalog changes out of order");
    }
    FERRY_ASSIGN_OR_RETURN(CatalogEntry e, FromProto(c.entry()));
    out.push_back({c.seq(), c.forget(), std::move(e)});
  }
  return out;
}

namespace {
// A call that names a node and is answered with a status.
Status CallForNode(const MasterClient::Impl& impl,
                   const Rpc<pb::NodeRequest, pb::NodeResponse>& rpc, const std::string& node) {
  pb::NodeRequest req;
  req.set_node(node);
  pb::NodeResponse resp;
  FERRY_RETURN_IF_ERROR(impl.Call(rpc, req, &resp));
  FERRY_RETURN_IF_ERROR(impl.fence->Observe(resp.term()));
  return FromProto(resp.status());
}
}  // namespace

Status MasterClient::Unmount(const std::string& node) {
  return CallForNode(*impl_, FERRY_RPC(Unmount), node);
}

// Runs `call(first, count)` over chunks of at most the master's batch limit.
template <typename T, typename F>
static Result<std::vector<T>> Chunked(size_t n, F&& call) {
  std::vector<T> out;
  out.reserve(n);
  for (size_t first = 0; first < n; first += kMaxBatch) {
    const size_t count = std::min<size_t>(kMaxBatch, n - first);
    FERRY_ASSIGN_OR_RETURN(auto part, call(first, count));
    for (auto& x : part) out.push_back(std::move(x));
  }
  return out;
}

Result<std::vector<Result<PutGrant>>> MasterClient::PutBegin(const std::vector<PutSpec>& items,
                                                             const std::string& client_node,
                                                             bool prefer_local) {
  return Chunked<Result<PutGrant>>(
      items.size(), [&](size_t first, size_t count) -> Result<std::vector<Result<PutGrant>>> {
        pb::PutBeginRequest req;
        req.set_client_node(client_node);
        req.set_prefer_local(prefer_local);
        for (size_t i = first; i < first + count; ++i) {
          auto* it = req.add_items();
          it->set_key(items[i].key);
          it->set_size(items[i].size);
          it->set_replicas(items[i].replicas);
          it->set_preferred_segment(items[i].preferred);
          it->set_pin(static_cast<pb::PinKind>(items[i].pin));
          it->set_pin_ttl_ms(static_cast<uint64_t>(items[i].pin_ttl.count()));
          it->set_reserve(items[i].reserve);
        }
        pb::PutBeginResponse resp;
        FERRY_RETURN_IF_ERROR(impl_->Call(FERRY_RPC(PutBegin), req, &resp));
        FERRY_RETURN_IF_ERROR(impl_->fence->Observe(resp.term()));
        FERRY_RETURN_IF_ERROR(CheckCount(resp.results_size(), count));
        std::vector<Result<PutGrant>> out;
        out.reserve(count);
        for (size_t i = 0; i < count; ++i) {
          const auto& r = resp.results(static_cast<int>(i));
          PutGrant g{r.put_id(), {}, Term(r.timeout_ms())};
          Status st = ReadItem(r, items[first + i].size, &g.replicas);
          out.push_back(st.ok() ? Result<PutGrant>(std::move(g)) : Result<PutGrant>(st));
        }
        return out;
      });
}

// A chunked call answered with one status per item: `fill(req, i)` adds item
// i to a request.
template <typename Req, typename Resp, typename Fill>
static Result<std::vector<Status>> StatusCall(const MasterClient::Impl& impl, size_t n,
                                              const Rpc<Req, Resp>& rpc, Fill&& fill) {
  return Chunked<Status>(n, [&](size_t first, size_t count) -> Result<std::vector<Status>> {
    Req req;
    for (size_t i = first; i < first + count; ++i) fill(req, i);
    Resp resp;
    FERRY_RETURN_IF_ERROR(impl.Call(rpc, req, &resp));
    if constexpr (requires { resp.term(); }) {
      FERRY_RETURN_IF_ERROR(impl.fence->Observe(resp.term()));
    }
    return Statuses(resp, count);
  });
}

Result<std::vector<Status>> MasterClient::PutEnd(const std::vector<store::PutEnd>& items) {
  return StatusCall(*impl_, items.size(), FERRY_RPC(PutEnd), [&](pb::PutEndRequest& req, size_t i) {
    auto* it = req.add_items();
    it->set_key(items[i].key);
    it->set_put_id(items[i].put_id);
    it->set_commit(items[i].commit);
    it->set_reserved(items[i].reserved);
  });
}

Result<std::vector<Result<GetGrant>>> MasterClient::Get(const std::vector<std::string>& keys) {
  return Chunked<Result<GetGrant>>(
      keys.size(), [&](size_t first, size_t count) -> Result<std::vector<Result<GetGrant>>> {
        pb::KeysRequest req;
        for (size_t i = first; i < first + count; ++i) req.add_keys(keys[i]);
        pb::GetResponse resp;
        FERRY_RETURN_IF_ERROR(impl_->Call(FERRY_RPC(Get), req, &resp));
        FERRY_RETURN_IF_ERROR(impl_->fence->Observe(resp.term()));
        FERRY_RETURN_IF_ERROR(CheckCount(resp.results_size(), count));
        std::vector<Result<GetGrant>> out;
        out.reserve(count);
        for (size_t i = 0; i < count; ++i) {
          const auto& r = resp.results(static_cast<int>(i));
          GetGrant g{{r.size(), {}, Term(r.lease_ms())}, r.lease_id()};
          Status st = ReadItem(r, r.size(), &g.location.replicas);
          out.push_back(st.ok() ? Result<GetGrant>(std::move(g)) : Result<GetGrant>(st));
        }
        return out;
      });
}

Result<std::vector<Status>> MasterClient::ReleaseLeases(
    const std::vector<std::pair<std::string, uint64_t>>& leases) {
  return StatusCall(*impl_, leases.size(), FERRY_RPC(ReleaseLeases),
                    [&](pb::ReleaseRequest& req, size_t i) {
                      auto* it = req.add_items();
                      it->set_key(leases[i].first);
                      it->set_lease_id(leases[i].second);
                    });
}

Result<std::vector<Status>> MasterClient::Exists(const std::vector<std::string>& keys) {
  return StatusCall(*impl_, keys.size(), FERRY_RPC(Exists),
                    [&](pb::KeysRequest& req, size_t i) { req.add_keys(keys[i]); });
}

Result<std::vector<Status>> MasterClient::Remove(const std::vector<std::string>& keys, bool force) {
  return StatusCall(*impl_, keys.size(), FERRY_RPC(Remove), [&](pb::RemoveRequest& req, size_t i) {
    req.set_force(force);
    req.add_keys(keys[i]);
  });
}

Result<std::vector<Status>> MasterClient::Pin(const std::vector<std::string>& keys, StorePin pin,
                                              Millis ttl) {
  return StatusCall(*impl_, keys.size(), FERRY_RPC(Pin), [&](pb::PinRequest& req, size_t i) {
    auto* it = req.add_items();
    it->set_key(keys[i]);
    it->set_kind(static_cast<pb::PinKind>(pin));
    it->set_ttl_ms(static_cast<uint64_t>(ttl.count()));
  });
}

Result<StoreStats> MasterClient::Stats() {
  pb::StatsRequest req;
  pb::StatsResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call(FERRY_RPC(Stats), req, &resp));
  FERRY_RETURN_IF_ERROR(impl_->fence->Observe(resp.term()));
  StoreStats out;
  out.capacity = resp.capacity();
  out.used = resp.used();
  out.nodes = resp.nodes();
  out.objects = resp.objects();
  out.term = resp.term();
  out.recovered = resp.recovered();
  out.recovered_total = resp.recovered_total();
  std::lock_guard lk(impl_->mu);
  out.leader = impl_->current;
  return out;
}

Result<uint64_t> MasterClient::RemoveAll(bool force) {
  pb::RemoveAllRequest req;
  req.set_force(force);
  pb::RemoveAllResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call(FERRY_RPC(RemoveAll), req, &resp));
  return static_cast<uint64_t>(resp.removed());
}

}  // namespace ferry::store
