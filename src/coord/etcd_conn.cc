#include "coord/etcd_conn.h"

#include <chrono>

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

EtcdClient::Impl::Impl(const EtcdOptions& options) : timeout_(options.call_timeout) {
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 2 minutes; an etcd member that
  // restarts should be used again within a second of coming back. (The
  // minimum stays: gRPC also takes it as the connect timeout, and etcd's
  // listener answers a new connection only once it has read the client's
  // first request.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Without this, a channel that found its endpoint down waits out the
  // resolver's cooldown (about 10 s here) before it tries again.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 100);
  // Pings find a dead connection under a quiet watch; etcd refuses pings
  // closer than 5 s apart (--grpc-keepalive-min-time).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // One connection per endpoint and client, never shared with another
  // client in the process, so one's teardown cannot stall the other.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& ep : options.endpoints) {
    EtcdConn c;
    c.endpoint = ep;
    c.channel = grpc::CreateCustomChannel(ep, grpc::InsecureChannelCredentials(), args);
    c.kv = etcdserverpb::KV::NewStub(c.channel);
    c.lease = etcdserverpb::Lease::NewStub(c.channel);
    c.watch = etcdserverpb::Watch::NewStub(c.channel);
    conns_.push_back(std::move(c));
  }
}

void EtcdClient::Impl::MoveOn(size_t failed) {
  size_t expected = failed % conns_.size();
  current_.compare_exchange_strong(expected, (expected + 1) % conns_.size(),
                                   std::memory_order_acq_rel);
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Impl::Context(Millis timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

}  // namespace ferry::coord
