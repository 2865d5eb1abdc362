#include "coord/etcd_conn.h"

#include <chrono>
#include <utility>

namespace ferry::coord {

Status FromGrpc(const grpc::Status& st, std::string_view what, const std::string& endpoint) {
  std::string msg = "etcd " + std::string(what) + " at " + endpoint + ": " + st.error_message();
  switch (st.error_code()) {
    case grpc::StatusCode::OK: return Status::Ok();
    case grpc::StatusCode::UNAVAILABLE: return Status::Unavailable(std::move(msg));
    case grpc::StatusCode::DEADLINE_EXCEEDED: return Status::Timeout(std::move(msg));
    case grpc::StatusCode::NOT_FOUND: return Status::NotFound(std::move(msg));
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return Status::InvalidArgument(std::move(msg));
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(std::move(msg));
    case grpc::StatusCode::CANCELLED: return Status::Cancelled(std::move(msg));
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return Status::Unauthenticated(std::move(msg));
    default: return Status::Internal(std::move(msg));
  }
}

EtcdClient::Impl::Impl(const EtcdOptions& options)
    : timeout_(options.call_timeout), endpoints_(options.endpoints) {
  // gRPC's default reconnect backoff grows to 2 minutes; an etcd member that
  // restarts should be used again within a second of coming back. (The
  // minimum stays: gRPC also takes it as the connect timeout.)
  args_.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args_.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A channel that found its endpoint down re-resolves it before trying
  // again; the resolver's default cooldown is 30 s.
  args_.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 100);
  // Pings find a dead connection under a quiet watch; etcd refuses pings
  // closer than 5 s apart (--grpc-keepalive-min-time).
  args_.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args_.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args_.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // One connection per endpoint and channel, never shared with another
  // client's in the process, so one's teardown cannot stall the other.
  args_.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& ep : endpoints_) conns_.push_back(Connect(ep));
  revived_.assign(endpoints_.size(), Clock::time_point());
}

std::shared_ptr<EtcdConn> EtcdClient::Impl::Connect(const std::string& endpoint) const {
  auto c = std::make_shared<EtcdConn>();
  c->endpoint = endpoint;
  c->channel = grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args_);
  c->kv = etcdserverpb::KV::NewStub(c->channel);
  c->lease = etcdserverpb::Lease::NewStub(c->channel);
  c->watch = etcdserverpb::Watch::NewStub(c->channel);
  return c;
}

std::shared_ptr<EtcdConn> EtcdClient::Impl::conn(size_t i) const {
  std::lock_guard lk(mu_);
  return conns_[i % conns_.size()];
}

void EtcdClient::Impl::Revive(size_t i) {
  i %= endpoints_.size();
  {
    std::lock_guard lk(mu_);
    if (Clock::now() - revived_[i] < Millis(200)) return;
    revived_[i] = Clock::now();
  }
  auto fresh = Connect(endpoints_[i]);  // no connection is made until a call
  std::shared_ptr<EtcdConn> old;
  std::lock_guard lk(mu_);
  old = std::exchange(conns_[i], std::move(fresh));  // released after the lock, by `old`
}

void EtcdClient::Impl::MoveOn(size_t failed) {
  size_t expected = failed % size();
  current_.compare_exchange_strong(expected, (expected + 1) % size(), std::memory_order_acq_rel);
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Impl::Context(Millis timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

}  // namespace ferry::coord
