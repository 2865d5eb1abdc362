// A client of etcd's v3 gRPC API (KV, Lease; watches in etcd_watch.h, lease
// keep-alive in lease_keeper.h), for the engine's metadata and the store's
// masters. docs/cluster.md says why gRPC rather than the JSON gateway.
//
// Endpoints: every call goes to the endpoint that last answered; when it is
// Unavailable the call moves on to the next, once round the list. gRPC
// reconnects each endpoint by itself (backoff capped at 1 s). Every call
// attempt carries EtcdOptions::call_timeout as its deadline, so a call blocks
// at most that long per endpoint. Every reply is validated: one that does
// not answer what was asked is ProtocolError.
//
// Errors: Unavailable when no endpoint answers (the message names them),
// Timeout when the endpoint tried did not answer in time (the next call
// starts at the next endpoint), InvalidArgument for input etcd refuses,
// NotFound for an unknown or expired lease, ProtocolError for a malformed
// reply, Internal for any other gRPC failure.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"

namespace ferry::coord {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // "host:port" (etcd_url.h parses lists)
  Millis call_timeout{3000};           // the deadline of each attempt
};

using LeaseId = int64_t;  // 0: no lease

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;  // the revision of the last change
  int64_t version = 0;       // changes since creation, from 1
  LeaseId lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;  // sorted by key
  int64_t revision = 0;       // the store's revision the read saw
};

// One condition of a transaction, on a key's current state. An absent key
// has version, create and mod revision 0.
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kVersion;
  Op op = Op::kEqual;
  int64_t number = 0;  // for every target but kValue
  std::string value;   // for kValue

  static Compare Absent(std::string key);
  static Compare ModRevisionIs(std::string key, int64_t revision);
  static Compare ValueIs(std::string key, std::string value);
  static Compare LeaseIs(std::string key, LeaseId lease);
};

// One operation of a transaction.
struct TxnOp {
  enum class Kind { kGet, kPut, kDelete };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;    // kPut
  LeaseId lease = 0;    // kPut
  bool prefix = false;  // kGet, kDelete: every key starting with `key`

  static TxnOp Get(std::string key, bool prefix = false);
  static TxnOp Put(std::string key, std::string value, LeaseId lease = 0);
  static TxnOp Delete(std::string key, bool prefix = false);
};

struct TxnResult {
  bool succeeded = false;  // the comparisons held: the success branch ran
  int64_t revision = 0;
  // One per operation of the branch that ran, in order; filled for kGet.
  std::vector<RangeResult> reads;
};

struct Lease {
  LeaseId id = 0;
  int64_t ttl_seconds = 0;  // as etcd granted it
};

class EtcdClient {
 public:
  // Makes the channels; connects lazily, so it does not block. InvalidArgument
  // for no endpoint, a malformed one or a call_timeout under 1 ms.
  static Result<std::shared_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const EtcdOptions& options() const { return options_; }
  // The endpoint the next call goes to first.
  std::string current_endpoint() const;

  // The key, or nullopt when it is absent.
  Result<std::optional<KeyValue>> Get(std::string_view key);
  // Every key starting with `prefix` (an empty prefix: every key).
  Result<RangeResult> GetPrefix(std::string_view prefix);
  // Sets `key`, bound to `lease` when non-zero (deleted when it expires).
  // Returns the revision of the change. NotFound for an unknown lease.
  Result<int64_t> Put(std::string_view key, std::string_view value, LeaseId lease = 0);
  // Deletes `key`, or every key starting with it; returns how many went.
  Result<int64_t> Delete(std::string_view key, bool prefix = false);
  // Runs `success` when every comparison holds, else `failure`, atomically.
  Result<TxnResult> Txn(const std::vector<Compare>& compares, const std::vector<TxnOp>& success,
                        const std::vector<TxnOp>& failure = {});
  // Creates `key` only if it is absent: true when it was created, false when
  // it existed (*existing, if given, is then its current state).
  Result<bool> CreateIfAbsent(std::string_view key, std::string_view value, LeaseId lease = 0,
                              std::optional<KeyValue>* existing = nullptr);
  // Sets `key` only if its mod_revision is `revision` (0: only if absent);
  // true when it was set.
  Result<bool> CompareAndSwap(std::string_view key, int64_t revision, std::string_view value,
                              LeaseId lease = 0);
  // Sets `key` only if its value is `expected`; true when it was set.
  Result<bool> CompareValueAndSwap(std::string_view key, std::string_view expected,
                                   std::string_view value, LeaseId lease = 0);
  // Deletes `key` only if its mod_revision is `revision`; true when it went.
  Result<bool> CompareAndDelete(std::string_view key, int64_t revision);

  // A lease of `ttl_seconds` (>= 1, else InvalidArgument); etcd may grant
  // a longer one (its minimum is about 1.5 election timeouts).
  Result<Lease> LeaseGrant(int64_t ttl_seconds);
  // Ends the lease now, deleting its keys. NotFound when it is already gone.
  Status LeaseRevoke(LeaseId id);
  // Renews the lease once; returns its new TTL in seconds. NotFound when it
  // has expired or was revoked. lease_keeper.h does this in the background.
  Result<int64_t> LeaseKeepAliveOnce(LeaseId id);
  // The lease's remaining seconds; NotFound when it expired or was revoked.
  Result<int64_t> LeaseTimeToLive(LeaseId id);

  // Tests only, before the client is shared: `fault` is asked before each
  // call with its RPC's name ("Range", "Txn", "LeaseKeepAlive", ...); an
  // error it returns fails that call, which is then not sent.
  void InjectFaults(std::function<Status(std::string_view rpc)> fault);

  class Impl;
  Impl& impl() { return *impl_; }  // for etcd_watch.cc and lease_keeper.cc

 private:
  EtcdClient(EtcdOptions options, std::unique_ptr<Impl> impl);
  const EtcdOptions options_;
  std::unique_ptr<Impl> impl_;
};

// The end of the range of keys starting with `prefix`, as etcd takes it.
std::string PrefixEnd(std::string_view prefix);

}  // namespace ferry::coord
