// The master's gRPC API for nodes and clients, with a deadline on every call
// and every response checked before use. Batches longer than the master's
// limit are split. Thread safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "ferry/status.h"
#include "ferry/store.h"
#include "store/rpc/requests.h"
#include "store/rpc/term_fence.h"

namespace grpc {
class Service;
}

namespace ferry::store {

class MasterClient {
 public:
  // A channel to `address` ("host:port"); connects lazily and reconnects fast
  // (a master restart is seen within about a second). "etcd://ENDPOINTS/
  // CLUSTER" follows the cluster's elected master (store/rpc/leader.h):
  // each call goes to the leader etcd names then, waiting up to
  // `rpc_timeout` for one while none leads (then Unavailable); an etcd
  // unreachable at Connect fails it, with etcd's status. With `key`, every
  // call carries a token made with it (call_auth.h); a master with another
  // secret, or with one while this side has none, fails calls with
  // Unauthenticated.
  // Every answer's master term goes through `fence` (a new one when null;
  // share one between clients of several masters): an answer of a term
  // older than one seen fails the call with Unavailable, unused.
  static Result<std::unique_ptr<MasterClient>> Connect(
      const std::string& address, Millis rpc_timeout,
      std::shared_ptr<const auth::Key> key = nullptr, std::shared_ptr<TermFence> fence = nullptr);
  // Calls straight into `local`, a master in this process
  // (MasterServer::InProcessService) at `address`, on the calling thread: no
  // socket, no token, no deadline beyond the master's own bounded waits.
  // `local` must outlive the client. FERRY_IN_PROCESS_MASTER=0 calls it over
  // gRPC at `address` instead, as Connect above, for comparisons.
  static Result<std::unique_ptr<MasterClient>> Connect(
      const std::string& address, grpc::Service* local, Millis rpc_timeout,
      std::shared_ptr<const auth::Key> key = nullptr, std::shared_ptr<TermFence> fence = nullptr);
  ~MasterClient();

  const std::string& address() const { return address_; }
  const TermFence& fence() const;

  // Node membership (Master::Mount, Master::Heartbeat). The heartbeat's
  // changes are checked: valid entries, numbered from acked+1 on.
  Result<MountReply> Mount(const NodeMount& mount);
  // `ack_only`: records `acked` and fetches nothing (the answer is empty).
  // `hold`: a master in catalog-sync mode may wait that long for a change.
  Result<std::vector<CatalogChange>> Heartbeat(const std::string& node, uint64_t acked,
                                               bool ack_only = false, Millis hold = Millis(0));
  Status Unmount(const std::string& node);

  // One result per item. A failed call fails as a whole.
  Result<std::vector<Result<PutGrant>>> PutBegin(const std::vector<PutSpec>& items,
                                                 const std::string& client_node, bool prefer_local);
  Result<std::vector<Status>> PutEnd(const std::vector<store::PutEnd>& items);
  Result<std::vector<Result<GetGrant>>> Get(const std::vector<std::string>& keys);
  // Ends leases from Get early: (key, lease id) pairs.
  Result<std::vector<Status>> ReleaseLeases(
      const std::vector<std::pair<std::string, uint64_t>>& leases);
  Result<std::vector<Status>> Exists(const std::vector<std::string>& keys);
  Result<std::vector<Status>> Remove(const std::vector<std::string>& keys, bool force);
  Result<std::vector<Status>> Pin(const std::vector<std::string>& keys, StorePin pin, Millis ttl);
  Result<StoreStats> Stats();
  Result<uint64_t> RemoveAll(bool force);

  class Impl;

 private:
  MasterClient(std::string address, std::unique_ptr<Impl> impl);
  std::string address_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::store
