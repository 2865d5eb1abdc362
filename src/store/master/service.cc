#include "store/master/service.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <span>
#include <string_view>
#include <thread>

#include "common/host.h"
#include "common/log.h"
#include "proto/store.grpc.pb.h"
#include "store/master/socket_server.h"
#include "store/rpc/call_auth.h"
#include "store/rpc/catalog_wire.h"
#include "store/rpc/master_wire.h"
#include "store/rpc/proto_util.h"

namespace ferry::store {
namespace {

namespace pb = ::ferry::store::v1;

// Pin TTLs beyond a year are refused rather than overflowing the clock.
constexpr uint64_t kMaxTtlMs = 365ull * 24 * 3600 * 1000;

Status CheckPin(int kind, uint64_t ttl_ms) {
  if (!pb::PinKind_IsValid(kind) || ttl_ms > kMaxTtlMs) {
    return Status::InvalidArgument("unknown pin kind or TTL over a year");
  }
  return Status::Ok();
}

grpc::Status BadRequest(const std::string& what) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what);
}

// Checks the item count of a batch request.
grpc::Status CheckCount(int n) {
  if (n <= 0) return BadRequest("a request needs at least one item");
  if (n > MasterServer::kMaxBatch) {
    return BadRequest("at most " + std::to_string(MasterServer::kMaxBatch) + " items per request");
  }
  return grpc::Status::OK;
}

void ToProto(const StoreReplica& a, pb::Replica* r) {
  r->set_epoch(a.epoch);
  for (const auto& e : a.extents) {
    auto* x = r->add_extents();
    x->set_segment(e.segment);
    x->set_addr(e.addr);
    x->set_length(e.length);
  }
}

// Runs a handler, turning anything thrown into INTERNAL: no exception crosses
// the gRPC boundary.
template <typename F>
grpc::Status Guard(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    FERRY_LOG_ERROR("master: {}: {}", what, e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

class Service final : public pb::Master::Service {
 public:
  // `checker` (null: no cluster secret) and `socket_port` (Hello's answer)
  // outlive the service.
  Service(Master& m, CallTokenChecker* checker, const std::atomic<int>& socket_port)
      : m_(m), checker_(checker), socket_port_(socket_port) {}

  uint64_t auth_failures() const { return refused_.count(); }

  // OK when the call's token checks out, or no secret is set; a refusal is
  // counted against `peer`. `token` null: the call had none.
  Status Admit(const char* method, const std::string_view* token, const std::string& peer) {
    if (checker_ == nullptr) return Status::Ok();
    Status st = checker_->Check(method, token);
    if (!st.ok()) refused_.Add(peer, std::string(method) + ": " + st.message());
    return st;
  }

  // Where the socket calls are: no secret is needed to learn it, since each
  // socket call proves it, and a caller refused here would be counted twice.
  grpc::Status Hello(grpc::ServerContext*, const pb::HelloRequest*,
                     pb::HelloResponse* resp) override {
    resp->set_socket_port(static_cast<uint32_t>(std::max(socket_port_.load(), 0)));
    resp->set_socket_version(master_wire::kVersion);
    return grpc::Status::OK;
  }

  grpc::Status Mount(grpc::ServerContext* ctx, const pb::MountRequest* req,
                     pb::MountResponse* resp) override {
    return Serve(ctx, "Mount", [&] {
      if (req->regions_size() > static_cast<int>(Space::kMaxRegions)) {
        return BadRequest("too many regions");
      }
      if (req->catalog_size() > kMaxCatalog) return BadRequest("catalog too long");
      NodeMount m{req->node(), req->epoch(), {}, {}, req->resumed()};
      for (const auto& r : req->regions()) m.regions.emplace_back(r.base(), r.size());
      // A malformed entry is left out, and so forgotten by the node.
      for (const auto& e : req->catalog()) {
        if (auto entry = FromProto(e); entry.ok()) m.catalog.push_back(std::move(entry).value());
      }
      auto reply = m_.Mount(m);
      SetStatus(reply.status(), resp->mutable_status());
      resp->set_node_ttl_ms(static_cast<uint64_t>(m_.options().node_ttl.count()));
      resp->set_term(m_.term());
      if (reply.ok()) {
        resp->set_recovered(reply.value().recovered);
        resp->set_catalog_sync(reply.value().catalog_sync);
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::NodeRequest* req,
                         pb::NodeResponse* resp) override {
    return Serve(ctx, "Heartbeat", [&] {
      // The master caps the hold; a huge one must not overflow on the way.
      const Millis hold(std::min<uint64_t>(req->hold_ms(), 60'000));
      auto changes = m_.Heartbeat(req->node(), req->acked(), !req->ack_only(), hold);
      SetStatus(changes.status(), resp->mutable_status());
      resp->set_term(m_.term());
      if (!changes.ok()) return grpc::Status::OK;
      for (const CatalogChange& c : changes.value()) {
        auto* out = resp->add_changes();
        out->set_seq(c.seq);
        out->set_forget(c.forget);
        ToProto(c.entry, out->mutable_entry());
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status Unmount(grpc::ServerContext* ctx, const pb::NodeRequest* req,
                       pb::NodeResponse* resp) override {
    return Serve(ctx, "Unmount", [&] {
      SetStatus(m_.Unmount(req->node()), resp->mutable_status());
      resp->set_term(m_.term());
      return grpc::Status::OK;
    });
  }

  grpc::Status PutBegin(grpc::ServerContext* ctx, const pb::PutBeginRequest* req,
                        pb::PutBeginResponse* resp) override {
    return Serve(ctx, "PutBegin", [&] {
      if (auto st = CheckCount(req->items_size()); !st.ok()) return st;
      resp->set_term(m_.term());
      const std::string client = req->prefer_local() ? req->client_node() : std::string();
      for (const auto& item : req->items()) {
        auto* out = resp->add_results();
        PutSpec spec;
        spec.key = item.key();
        spec.size = item.size();
        spec.replicas = item.replicas() == 0 ? 1 : item.replicas();
        spec.preferred = item.preferred_segment();
        if (Status st = CheckPin(item.pin(), item.pin_ttl_ms()); !st.ok()) {
          SetStatus(st, out->mutable_status());
          continue;
        }
        spec.pin = static_cast<StorePin>(item.pin());
        spec.pin_ttl = Millis(item.pin_ttl_ms());
        spec.reserve = item.reserve();
        auto grant = m_.PutBegin(spec, client);
        SetStatus(grant.status(), out->mutable_status());
        if (!grant.ok()) continue;
        out->set_put_id(grant.value().put_id);
        out->set_timeout_ms(static_cast<uint64_t>(grant.value().timeout.count()));
        for (const auto& a : grant.value().replicas) ToProto(a, out->add_replicas());
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status PutEnd(grpc::ServerContext* ctx, const pb::PutEndRequest* req,
                      pb::StatusesResponse* resp) override {
    return Serve(ctx, "PutEnd", [&] {
      if (auto st = CheckCount(req->items_size()); !st.ok()) return st;
      resp->set_term(m_.term());
      std::vector<store::PutEnd> items;
      items.reserve(static_cast<size_t>(req->items_size()));
      for (const auto& item : req->items()) {
        items.push_back({item.key(), item.put_id(), item.commit(), item.reserved()});
      }
      for (const Status& st : m_.PutEnd(items)) SetStatus(st, resp->add_results());
      return grpc::Status::OK;
    });
  }

  grpc::Status Get(grpc::ServerContext* ctx, const pb::KeysRequest* req,
                   pb::GetResponse* resp) override {
    return Serve(ctx, "Get", [&] {
      if (auto st = CheckCount(req->keys_size()); !st.ok()) return st;
      resp->set_term(m_.term());
      for (const auto& key : req->keys()) {
        auto* out = resp->add_results();
        auto grant = m_.Get(key);
        SetStatus(grant.status(), out->mutable_status());
        if (!grant.ok()) continue;
        const ObjectLocation& loc = grant.value().location;
        out->set_size(loc.size);
        out->set_lease_ms(static_cast<uint64_t>(loc.lease.count()));
        out->set_lease_id(grant.value().lease_id);
        for (const auto& a : loc.replicas) ToProto(a, out->add_replicas());
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status ReleaseLeases(grpc::ServerContext* ctx, const pb::ReleaseRequest* req,
                             pb::StatusesResponse* resp) override {
    return Serve(ctx, "ReleaseLeases", [&] {
      if (auto st = CheckCount(req->items_size()); !st.ok()) return st;
      resp->set_term(m_.term());
      for (const auto& item : req->items()) {
        SetStatus(m_.ReleaseLease(item.key(), item.lease_id()), resp->add_results());
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status Exists(grpc::ServerContext* ctx, const pb::KeysRequest* req,
                      pb::ExistsResponse* resp) override {
    return Serve(ctx, "Exists", [&] {
      if (auto st = CheckCount(req->keys_size()); !st.ok()) return st;
      for (const auto& key : req->keys()) SetStatus(m_.Exists(key), resp->add_results());
      return grpc::Status::OK;
    });
  }

  grpc::Status Remove(grpc::ServerContext* ctx, const pb::RemoveRequest* req,
                      pb::StatusesResponse* resp) override {
    return Serve(ctx, "Remove", [&] {
      if (auto st = CheckCount(req->keys_size()); !st.ok()) return st;
      resp->set_term(m_.term());
      const std::vector<std::string> keys(req->keys().begin(), req->keys().end());
      for (const Status& st : m_.Remove(keys, req->force())) SetStatus(st, resp->add_results());
      return grpc::Status::OK;
    });
  }

  grpc::Status Pin(grpc::ServerContext* ctx, const pb::PinRequest* req,
                   pb::StatusesResponse* resp) override {
    return Serve(ctx, "Pin", [&] {
      if (auto st = CheckCount(req->items_size()); !st.ok()) return st;
      resp->set_term(m_.term());
      for (const auto& item : req->items()) {
        Status st = CheckPin(item.kind(), item.ttl_ms());
        if (st.ok()) {
          st = m_.SetPin(item.key(), static_cast<StorePin>(item.kind()), Millis(item.ttl_ms()));
        }
        SetStatus(st, resp->add_results());
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status RemoveAll(grpc::ServerContext* ctx, const pb::RemoveAllRequest* req,
                         pb::RemoveAllResponse* resp) override {
    return Serve(ctx, "RemoveAll", [&] {
      resp->set_removed(m_.RemoveAll(req->force()));
      return grpc::Status::OK;
    });
  }

  grpc::Status Stats(grpc::ServerContext* ctx, const pb::StatsRequest*,
                     pb::StatsResponse* resp) override {
    return Serve(ctx, "Stats", [&] {
      const MasterStats s = m_.Stats();
      resp->set_capacity(s.space.capacity);
      resp->set_used(s.space.used);
      resp->set_nodes(s.space.nodes);
      resp->set_objects(s.objects);
      resp->set_term(s.term);
      resp->set_recovered(s.recovered);
      resp->set_recovered_total(s.recovered_total);
      return grpc::Status::OK;
    });
  }

 private:
  // Runs a handler once the call's token checks out (with a secret).
  template <typename F>
  grpc::Status Serve(grpc::ServerContext* ctx, const char* method, F&& f) {
    if (checker_ != nullptr) {
      const auto& md = ctx->client_metadata();
      auto it = md.find(kTokenHeader);
      std::string_view token;
      if (it != md.end()) token = std::string_view(it->second.data(), it->second.size());
      Status st = Admit(method, it == md.end() ? nullptr : &token, ctx->peer());
      if (!st.ok()) {
        return grpc::Status(st.code() == StatusCode::kResourceExhausted
                                ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                : grpc::StatusCode::UNAUTHENTICATED,
                            st.message());
      }
    }
    if (Status open = m_.Gate(); !open.ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, open.message());
    }
    return Guard(method, std::forward<F>(f));
  }

  Master& m_;
  CallTokenChecker* const checker_;
  const std::atomic<int>& socket_port_;
  log::Refusals refused_{"master"};  // calls without a good token
};

SocketReply Refused(const Status& st) {
  return {st.code(), master_wire::MessagePayload(st.message())};
}

// One socket call, as gRPC would make it: the request parsed, the service's
// method run and its answer serialized.
template <typename Req, typename Resp>
SocketReply Dispatch(pb::Master::Service& s,
                     grpc::Status (pb::Master::Service::*method)(grpc::ServerContext*, const Req*,
                                                                 Resp*),
                     std::span<const uint8_t> body) {
  Req req;
  if (!req.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Refused(Status::InvalidArgument("malformed request"));
  }
  Resp resp;
  grpc::ServerContext ctx;
  grpc::Status st = (s.*method)(&ctx, &req, &resp);
  if (!st.ok()) {
    return {CodeFromGrpc(st.error_code()), master_wire::MessagePayload(st.error_message())};
  }
  SocketReply out;
  out.payload.resize(resp.ByteSizeLong());
  resp.SerializeWithCachedSizesToArray(out.payload.data());
  return out;
}

// A socket request, checked and run on `local` (the in-process service:
// the same checks and gate), its token checked by `remote`.
SocketReply ServeSocket(Service& remote, Service& local, const framing::Frame& f,
                        const std::string& peer) {
  using master_wire::Type;
  const char* name = master_wire::MethodName(f.type);
  if (name == nullptr) return Refused(Status::InvalidArgument("not a method"));
  std::string_view token;
  std::span<const uint8_t> body;
  if (Status st = master_wire::DecodeRequest(f.payload, &token, &body); !st.ok()) {
    return Refused(st);
  }
  if (Status st = remote.Admit(name, token.empty() ? nullptr : &token, peer); !st.ok()) {
    return Refused(st);
  }
  using S = pb::Master::Service;
  switch (static_cast<Type>(f.type)) {
    case Type::kPutBegin: return Dispatch(local, &S::PutBegin, body);
    case Type::kPutEnd: return Dispatch(local, &S::PutEnd, body);
    case Type::kGet: return Dispatch(local, &S::Get, body);
    case Type::kReleaseLeases: return Dispatch(local, &S::ReleaseLeases, body);
    case Type::kExists: return Dispatch(local, &S::Exists, body);
    case Type::kRemove: return Dispatch(local, &S::Remove, body);
    case Type::kPin: return Dispatch(local, &S::Pin, body);
    case Type::kStats: return Dispatch(local, &S::Stats, body);
    case Type::kRemoveAll: return Dispatch(local, &S::RemoveAll, body);
    case Type::kGreeting: break;
  }
  return Refused(Status::InvalidArgument("not a method"));
}

}  // namespace

std::string MetricsText(const MasterStats& s) {
  std::string out;
  auto add = [&](const char* name, const char* type, const char* help, uint64_t v) {
    out += fmt::format("# HELP ferry_{} {}\n# TYPE ferry_{} {}\nferry_{} {}\n", name, help, name,
                       type, name, v);
  };
  add("store_capacity_bytes", "gauge", "Bytes contributed by mounted nodes.", s.space.capacity);
  add("store_used_bytes", "gauge", "Bytes allocated to objects.", s.space.used);
  add("store_deferred_bytes", "gauge", "Freed bytes still fenced by a lease or write grace.",
      s.deferred_bytes);
  add("store_nodes", "gauge", "Mounted nodes.", s.space.nodes);
  add("store_objects", "gauge", "Objects, complete or being written.", s.objects);
  add("store_puts_begun_total", "counter", "Puts begun.", s.puts_begun);
  add("store_puts_committed_total", "counter", "Puts committed.", s.puts_committed);
  add("store_puts_aborted_total", "counter", "Puts aborted or expired at commit.", s.puts_aborted);
  add("store_puts_reclaimed_total", "counter", "Abandoned puts reclaimed.", s.puts_reclaimed);
  add("store_reservations_total", "counter", "Space reserved ahead of puts.", s.reserved);
  add("store_reservations_committed_total", "counter", "Reservations committed as objects.",
      s.reserved_committed);
  add("store_gets_total", "counter", "Gets that found the key.", s.gets);
  add("store_get_misses_total", "counter", "Gets that did not.", s.get_misses);
  add("store_exists_total", "counter", "Exists checks.", s.exists);
  add("store_removes_total", "counter", "Objects removed.", s.removes);
  add("store_evicted_objects_total", "counter", "Objects evicted.", s.evicted_objects);
  add("store_evicted_bytes_total", "counter", "Bytes evicted.", s.evicted_bytes);
  add("store_sync_evictions_total", "counter", "Evictions run for a failed allocation.",
      s.sync_evictions);
  add("store_nodes_expired_total", "counter", "Nodes unmounted for missed heartbeats.",
      s.nodes_expired);
  add("store_replicas_dropped_total", "counter", "Replicas lost with their node.",
      s.replicas_dropped);
  add("store_auth_failures_total", "counter", "Calls refused for not proving the cluster secret.",
      s.auth_failures);
  add("store_term", "gauge", "The master's fencing term; 0 without elections.", s.term);
  add("store_recovered_objects", "gauge",
      "Objects rebuilt from the catalog of the last node to mount.", s.recovered);
  add("store_recovered_objects_total", "counter", "Objects rebuilt from nodes' catalogs.",
      s.recovered_total);
  add("store_catalog_pending", "gauge", "Catalog changes the nodes have still to apply.",
      s.catalog_pending);
  add("store_catalog_sync_timeouts_total", "counter",
      "Puts and removes that returned before their nodes applied the catalog change.",
      s.catalog_sync_timeouts);
  return out;
}

class MasterServer::Impl {
 public:
  Impl(const MasterOptions& o, std::shared_ptr<const auth::Key> key)
      : master(o),
        checker(key ? std::make_unique<CallTokenChecker>(std::move(key)) : nullptr),
        service(master, checker.get(), socket_port),
        local_service(master, nullptr, socket_port) {}
  MasterStats Stats() {
    MasterStats s = master.Stats();
    s.auth_failures = service.auth_failures();
    return s;
  }
  Master master;
  std::unique_ptr<CallTokenChecker> checker;  // null without a secret
  std::atomic<int> socket_port{0};            // 0: no socket calls
  Service service;
  Service local_service;                 // this process's calls: no token to check
  std::unique_ptr<SocketServer> socket;  // null with socket_port -1
  std::unique_ptr<grpc::Server> server;
  std::string address;
  httplib::Server http;
  int http_port = -1;
  std::thread http_thread;
};

MasterServer::MasterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MasterServer::~MasterServer() {
  impl_->master.Close();  // held heartbeats and commits waiting on them return
  if (impl_->http_port >= 0) {
    impl_->http.stop();
    impl_->http_thread.join();
  }
  impl_->socket.reset();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

const std::string& MasterServer::address() const { return impl_->address; }
int MasterServer::http_port() const { return impl_->http_port; }
uint64_t MasterServer::auth_failures() const { return impl_->service.auth_failures(); }
int MasterServer::socket_port() const { return impl_->socket_port.load(); }
uint64_t MasterServer::socket_calls() const {
  return impl_->socket == nullptr ? 0 : impl_->socket->calls();
}
size_t MasterServer::socket_connections() const {
  return impl_->socket == nullptr ? 0 : impl_->socket->connections();
}

grpc::Service* MasterServer::InProcessService() const { return &impl_->local_service; }

Result<std::unique_ptr<MasterServer>> MasterServer::Start(const MasterServerOptions& o) {
  if (o.master.low_watermark > o.master.high_watermark || o.master.high_watermark > 1.0 ||
      o.master.low_watermark < 0) {
    return Status::InvalidArgument("watermarks need 0 <= low <= high <= 1");
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const auth::Key> key,
                         auth::LoadConfigured(o.auth_key_file));
  if (key == nullptr && !IsLoopbackHost(o.host)) {
    FERRY_LOG_WARN(
        "master: {} is not a loopback address and no cluster secret is set ({}): any process "
        "that reaches it can read and change the store's metadata",
        o.host, auth::kKeyFileEnv);
  }
  auto impl = std::make_unique<Impl>(o.master, std::move(key));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o.host + ":" + std::to_string(o.port), grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&impl->service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  // Idle sockets must not pile up (issue 18, point 1). A connection that has
  // not sent its HTTP/2 preface and settings in 5 s is closed (gRPC waits
  // 120 s by default); one without a call for 10 minutes gets a GOAWAY, and
  // its channel reconnects at its next call; a peer that stops answering
  // pings is dropped. gRPC caps neither connections nor connections per peer.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 10 * 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || port == 0) {
    return Status::Unavailable("cannot serve gRPC on " + o.host + ":" + std::to_string(o.port));
  }
  impl->address = o.host + ":" + std::to_string(port);
  if (o.socket_port >= 0) {
    SocketServerOptions so;
    so.host = o.host;
    so.port = static_cast<uint16_t>(o.socket_port);
    so.max_connections = o.socket_max_connections;
    Impl* raw = impl.get();
    auto socket = SocketServer::Start(
        so, master_wire::kFormat, static_cast<uint16_t>(master_wire::Type::kGreeting),
        [raw](const framing::Frame& f, const std::string& peer) {
          return ServeSocket(raw->service, raw->local_service, f, peer);
        });
    if (!socket.ok()) {
      impl->server->Shutdown();
      return socket.status();
    }
    impl->socket = std::move(socket).value();
    impl->socket_port = impl->socket->port();
  }
  if (o.http_port >= 0) {
    Impl* raw = impl.get();
    auto extra_metrics = o.extra_metrics, extra_health = o.extra_health;
    raw->http.Get(
        "/metrics", [raw, extra_metrics](const httplib::Request&, httplib::Response& res) {
          res.set_content(MetricsText(raw->Stats()) + (extra_metrics ? extra_metrics() : ""),
                          "text/plain; version=0.0.4");
        });
    raw->http.Get("/health", [raw, extra_health](const httplib::Request&, httplib::Response& res) {
      const MasterStats st = raw->master.Stats();
      res.set_content(fmt::format("ok\nterm {}\nrecovered_objects {}\n", st.term, st.recovered) +
                          (extra_health ? extra_health() : ""),
                      "text/plain");
    });
    int hp = o.http_port == 0 ? raw->http.bind_to_any_port(o.host)
                              : (raw->http.bind_to_port(o.host, o.http_port) ? o.http_port : -1);
    if (hp <= 0) {
      raw->server->Shutdown();
      return Status::Unavailable("cannot serve HTTP on port " + std::to_string(o.http_port));
    }
    raw->http_port = hp;
    raw->http_thread = std::thread([raw] { raw->http.listen_after_bind(); });
  }
  return std::unique_ptr<MasterServer>(new MasterServer(std::move(impl)));
}

}  // namespace ferry::store
