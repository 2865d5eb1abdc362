// Inside the etcd client: one gRPC channel per endpoint, and the rule that
// moves a call on to the next endpoint while the one tried is Unavailable.
// Shared by etcd_client.cc, etcd_watch.cc and lease_keeper.cc.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
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

  size_t size() const { return endpoints_.size(); }
  const std::string& endpoint(size_t i) const { return endpoints_[i % endpoints_.size()]; }
  // Endpoint `i`'s channel and stubs as they are now; Revive may replace them.
  std::shared_ptr<EtcdConn> conn(size_t i) const;
  size_t current() const { return current_.load(std::memory_order_acquire); }
  // The next call starts past `failed`, unless another call moved on already.
  void MoveOn(size_t failed);
  void Settle(size_t good) { current_.store(good % size(), std::memory_order_release); }
  // Endpoint `i` was found unreachable: it gets a new channel, so its next
  // call connects at once instead of failing on the old channel's cached
  // error until gRPC's reconnect backoff ends (seen to last 5-10 s, whatever
  // the backoff arguments said). At most every 200 ms per endpoint; calls
  // under way keep the old channel until they end.
  void Revive(size_t i);
  Millis timeout() const { return timeout_; }
  void set_fault(std::function<Status(std::string_view)> fault) { fault_ = std::move(fault); }
  // A context whose deadline is `timeout` from now.
  std::unique_ptr<grpc::ClientContext> Context(Millis timeout) const;

  // Runs `attempt(conn, ctx)` -> grpc::Status at the current endpoint and,
  // while it is unreachable, at each next one once. Returns the first other
  // outcome (converted), or Unavailable naming every endpoint.
  template <typename F>
  Status Call(std::string_view what, F&& attempt) {
    if (fault_) FERRY_RETURN_IF_ERROR(fault_(what));
    const size_t start = current();
    std::string tried;
    for (size_t i = 0; i < size(); ++i) {
      const size_t idx = (start + i) % size();
      auto ctx = Context(timeout_);
      std::shared_ptr<EtcdConn> c = conn(idx);
      grpc::Status st = attempt(*c, *ctx);
      if (st.ok()) {
        Settle(idx);
        return Status::Ok();
      }
      // A deadline passed while the channel had no connection: the endpoint
      // is as good as down (a call to one that is down may wait for a
      // reconnection rather than fail at once).
      const bool unreachable = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                               (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                                c->channel->GetState(false) != GRPC_CHANNEL_READY);
      if (!unreachable) {
        if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) MoveOn(idx);
        return FromGrpc(st, what, c->endpoint);
      }
      Revive(idx);
      if (!tried.empty()) tried += "; ";
      tried += c->endpoint + ": " + st.error_message();
    }
    MoveOn(start);
    return Status::Unavailable("etcd " + std::string(what) + ": no endpoint answered (" + tried +
                               ")");
  }

 private:
  std::shared_ptr<EtcdConn> Connect(const std::string& endpoint) const;

  const Millis timeout_;
  const std::vector<std::string> endpoints_;
  std::function<Status(std::string_view)> fault_;  // EtcdClient::InjectFaults
  grpc::ChannelArguments args_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<EtcdConn>> conns_;  // guarded by mu_
  std::vector<Clock::time_point> revived_;        // guarded by mu_
  std::atomic<size_t> current_{0};
};

}  // namespace ferry::coord
