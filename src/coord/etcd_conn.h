// Inside the etcd client: one gRPC channel per endpoint, and the rule that
// moves a call on to the next endpoint while the one tried is Unavailable.
// Shared by etcd_client.cc, etcd_watch.cc and lease_keeper.cc.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "coord/etcd_client.h"
#include "proto/etcd/rpc.grpc.pb.h"

namespace ferry::coord {

struct EtcdConn {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

// `what` at `endpoint` failed with `st`: the Status callers see.
Status FromGrpc(const grpc::Status& st, std::string_view what, const std::string& endpoint);

class EtcdClient::Impl {
 public:
  explicit Impl(const EtcdOptions& options);

  size_t size() const { return conns_.size(); }
  EtcdConn& conn(size_t i) { return conns_[i % conns_.size()]; }
  size_t current() const { return current_.load(std::memory_order_acquire); }
  // The next call starts past `failed`, unless another call moved on already.
  void MoveOn(size_t failed);
  void Settle(size_t good) { current_.store(good % conns_.size(), std::memory_order_release); }
  Millis timeout() const { return timeout_; }
  // A context whose deadline is `timeout` from now.
  std::unique_ptr<grpc::ClientContext> Context(Millis timeout) const;

  // Runs `attempt(conn, ctx)` -> grpc::Status at the current endpoint and,
  // while it is unreachable, at each next one once. Returns the first other
  // outcome (converted), or Unavailable naming every endpoint.
  template <typename F>
  Status Call(std::string_view what, F&& attempt) {
    const size_t start = current();
    std::string tried;
    for (size_t i = 0; i < conns_.size(); ++i) {
      const size_t idx = (start + i) % conns_.size();
      auto ctx = Context(timeout_);
      grpc::Status st = attempt(conns_[idx], *ctx);
      if (st.ok()) {
        Settle(idx);
        return Status::Ok();
      }
      // A deadline passed while the channel had no connection: the endpoint
      // is as good as down (a call to one that is down may wait for a
      // reconnection rather than fail at once).
      const bool unreachable =
          st.error_code() == grpc::StatusCode::UNAVAILABLE ||
          (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
           conns_[idx].channel->GetState(false) != GRPC_CHANNEL_READY);
      if (!unreachable) {
        if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) MoveOn(idx);
        return FromGrpc(st, what, conns_[idx].endpoint);
      }
      if (!tried.empty()) tried += "; ";
      tried += conns_[idx].endpoint + ": " + st.error_message();
    }
    MoveOn(start);
    return Status::Unavailable("etcd " + std::string(what) + ": no endpoint answered (" + tried +
                               ")");
  }

 private:
  const Millis timeout_;
  std::vector<EtcdConn> conns_;
  std::atomic<size_t> current_{0};
};

}  // namespace ferry::coord
