#include "coord/etcd_client.h"

#include "coord/etcd_conn.h"
#include "coord/etcd_url.h"

namespace ferry::coord {
namespace {

namespace pb = etcdserverpb;

// What the reply's header says, checked: every etcd reply carries one, with
// the store's revision (>= 1 once etcd has started).
Result<int64_t> RevisionOf(bool has_header, const pb::ResponseHeader& h, std::string_view what) {
  if (!has_header || h.revision() < 1) {
    return Status::ProtocolError("etcd " + std::string(what) + ": reply without a revision");
  }
  return h.revision();
}

KeyValue FromPb(const mvccpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()};
}

void SetRange(std::string_view key, bool prefix, std::string* k, std::string* end) {
  k->assign(key);
  if (prefix) *end = PrefixEnd(key);
}

// A range reply for [key, end): every key inside it, sorted, each with
// revisions that make sense.
Result<RangeResult> CheckRange(const pb::RangeResponse& r, std::string_view key, bool prefix,
                               std::string_view what) {
  RangeResult out;
  FERRY_ASSIGN_OR_RETURN(out.revision, RevisionOf(r.has_header(), r.header(), what));
  auto bad = [&](std::string why) {
    return Status::ProtocolError("etcd " + std::string(what) + ": " + why);
  };
  if (!prefix && r.kvs_size() > 1) return bad("several keys for one");
  for (const auto& kv : r.kvs()) {
    if (prefix ? !kv.key().starts_with(key) : kv.key() != key) return bad("a key not asked for");
    if (kv.mod_revision() < kv.create_revision() || kv.create_revision() < 1 ||
        kv.mod_revision() > out.revision || kv.version() < 1) {
      return bad("a key with impossible revisions");
    }
    if (!out.kvs.empty() && kv.key() <= out.kvs.back().key) return bad("keys out of order");
    out.kvs.push_back(FromPb(kv));
  }
  return out;
}

void ToPb(const TxnOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case TxnOp::Kind::kGet: {
      auto* r = out->mutable_request_range();
      SetRange(op.key, op.prefix, r->mutable_key(), r->mutable_range_end());
      break;
    }
    case TxnOp::Kind::kPut: {
      auto* p = out->mutable_request_put();
      p->set_key(op.key);
      p->set_value(op.value);
      p->set_lease(op.lease);
      break;
    }
    case TxnOp::Kind::kDelete: {
      auto* d = out->mutable_request_delete_range();
      SetRange(op.key, op.prefix, d->mutable_key(), d->mutable_range_end());
      break;
    }
  }
}

void ToPb(const Compare& c, pb::Compare* out) {
  out->set_key(c.key);
  switch (c.op) {
    case Compare::Op::kEqual: out->set_result(pb::Compare::EQUAL); break;
    case Compare::Op::kNotEqual: out->set_result(pb::Compare::NOT_EQUAL); break;
    case Compare::Op::kGreater: out->set_result(pb::Compare::GREATER); break;
    case Compare::Op::kLess: out->set_result(pb::Compare::LESS); break;
  }
  switch (c.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case Compare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

}  // namespace

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  // The first key past every key that starts with `prefix`: bump the last
  // byte that can be bumped; none (empty, or all 0xff): every key ("\0").
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Compare Compare::Absent(std::string key) {
  return {std::move(key), Target::kVersion, Op::kEqual, 0, {}};
}
Compare Compare::ModRevisionIs(std::string key, int64_t revision) {
  return {std::move(key), Target::kModRevision, Op::kEqual, revision, {}};
}
Compare Compare::ValueIs(std::string key, std::string value) {
  return {std::move(key), Target::kValue, Op::kEqual, 0, std::move(value)};
}
Compare Compare::LeaseIs(std::string key, LeaseId lease) {
  return {std::move(key), Target::kLease, Op::kEqual, lease, {}};
}
TxnOp TxnOp::Get(std::string key, bool prefix) {
  return {Kind::kGet, std::move(key), {}, 0, prefix};
}
TxnOp TxnOp::Put(std::string key, std::string value, LeaseId lease) {
  return {Kind::kPut, std::move(key), std::move(value), lease, false};
}
TxnOp TxnOp::Delete(std::string key, bool prefix) {
  return {Kind::kDelete, std::move(key), {}, 0, prefix};
}

Result<std::shared_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return Status::InvalidArgument("etcd: no endpoint given");
  std::string joined;
  for (const auto& ep : options.endpoints) joined += (joined.empty() ? "" : ",") + ep;
  // One parser for every list, so a bad endpoint reads the same everywhere.
  FERRY_RETURN_IF_ERROR(ParseEtcdEndpoints(joined).status());
  if (options.call_timeout < Millis(1)) {
    return Status::InvalidArgument("etcd: call_timeout must be at least 1 ms");
  }
  auto impl = std::make_unique<Impl>(options);
  return std::shared_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(impl)));
}

EtcdClient::EtcdClient(EtcdOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

std::string EtcdClient::current_endpoint() const { return impl_->endpoint(impl_->current()); }

void EtcdClient::InjectFaults(std::function<Status(std::string_view rpc)> fault) {
  impl_->set_fault(std::move(fault));
}

Result<std::optional<KeyValue>> EtcdClient::Get(std::string_view key) {
  pb::RangeRequest req;
  req.set_key(std::string(key));
  pb::RangeResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call("Range", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    return c.kv->Range(&ctx, req, &resp);
  }));
  FERRY_ASSIGN_OR_RETURN(RangeResult r, CheckRange(resp, key, false, "Range"));
  if (r.kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(r.kvs.front()));
}

Result<RangeResult> EtcdClient::GetPrefix(std::string_view prefix) {
  pb::RangeRequest req;
  SetRange(prefix, true, req.mutable_key(), req.mutable_range_end());
  pb::RangeResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call("Range", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    return c.kv->Range(&ctx, req, &resp);
  }));
  if (resp.more()) return Status::ProtocolError("etcd Range: a partial reply without a limit");
  return CheckRange(resp, prefix, true, "Range");
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, LeaseId lease) {
  if (key.empty()) return Status::InvalidArgument("etcd Put: empty key");
  pb::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(lease);
  pb::PutResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call(
      "Put", [&](EtcdConn& c, grpc::ClientContext& ctx) { return c.kv->Put(&ctx, req, &resp); }));
  return RevisionOf(resp.has_header(), resp.header(), "Put");
}

Result<int64_t> EtcdClient::Delete(std::string_view key, bool prefix) {
  if (key.empty() && !prefix) return Status::InvalidArgument("etcd DeleteRange: empty key");
  pb::DeleteRangeRequest req;
  SetRange(key, prefix, req.mutable_key(), req.mutable_range_end());
  pb::DeleteRangeResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call("DeleteRange", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    return c.kv->DeleteRange(&ctx, req, &resp);
  }));
  FERRY_RETURN_IF_ERROR(RevisionOf(resp.has_header(), resp.header(), "DeleteRange").status());
  if (resp.deleted() < 0 || (!prefix && resp.deleted() > 1)) {
    return Status::ProtocolError("etcd DeleteRange: deleted " + std::to_string(resp.deleted()));
  }
  return resp.deleted();
}

Result<TxnResult> EtcdClient::Txn(const std::vector<Compare>& compares,
                                  const std::vector<TxnOp>& success,
                                  const std::vector<TxnOp>& failure) {
  pb::TxnRequest req;
  for (const auto& c : compares) ToPb(c, req.add_compare());
  for (const auto& op : success) ToPb(op, req.add_success());
  for (const auto& op : failure) ToPb(op, req.add_failure());
  pb::TxnResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call(
      "Txn", [&](EtcdConn& c, grpc::ClientContext& ctx) { return c.kv->Txn(&ctx, req, &resp); }));
  TxnResult out;
  FERRY_ASSIGN_OR_RETURN(out.revision, RevisionOf(resp.has_header(), resp.header(), "Txn"));
  out.succeeded = resp.succeeded();
  const auto& ran = out.succeeded ? success : failure;
  if (resp.responses_size() != static_cast<int>(ran.size())) {
    return Status::ProtocolError("etcd Txn: " + std::to_string(resp.responses_size()) +
                                 " results for " + std::to_string(ran.size()) + " operations");
  }
  for (size_t i = 0; i < ran.size(); ++i) {
    const auto& r = resp.responses(static_cast<int>(i));
    const bool match = (ran[i].kind == TxnOp::Kind::kGet && r.has_response_range()) ||
                       (ran[i].kind == TxnOp::Kind::kPut && r.has_response_put()) ||
                       (ran[i].kind == TxnOp::Kind::kDelete && r.has_response_delete_range());
    if (!match) return Status::ProtocolError("etcd Txn: a result of another kind than asked");
    RangeResult read;
    if (r.has_response_range()) {
      // Results inside a transaction carry the transaction's header.
      pb::RangeResponse range = r.response_range();
      *range.mutable_header() = resp.header();
      FERRY_ASSIGN_OR_RETURN(read, CheckRange(range, ran[i].key, ran[i].prefix, "Txn"));
    }
    out.reads.push_back(std::move(read));
  }
  return out;
}

Result<bool> EtcdClient::CreateIfAbsent(std::string_view key, std::string_view value, LeaseId lease,
                                        std::optional<KeyValue>* existing) {
  if (key.empty()) return Status::InvalidArgument("etcd Txn: empty key");
  std::string k(key);
  FERRY_ASSIGN_OR_RETURN(
      TxnResult r,
      Txn({Compare::Absent(k)}, {TxnOp::Put(k, std::string(value), lease)}, {TxnOp::Get(k)}));
  if (!r.succeeded && existing != nullptr) {
    *existing = r.reads[0].kvs.empty() ? std::nullopt : std::optional(r.reads[0].kvs[0]);
  }
  return r.succeeded;
}

Result<bool> EtcdClient::CompareAndSwap(std::string_view key, int64_t revision,
                                        std::string_view value, LeaseId lease) {
  if (key.empty()) return Status::InvalidArgument("etcd Txn: empty key");
  std::string k(key);
  FERRY_ASSIGN_OR_RETURN(TxnResult r, Txn({Compare::ModRevisionIs(k, revision)},
                                          {TxnOp::Put(k, std::string(value), lease)}));
  return r.succeeded;
}

Result<bool> EtcdClient::CompareValueAndSwap(std::string_view key, std::string_view expected,
                                             std::string_view value, LeaseId lease) {
  if (key.empty()) return Status::InvalidArgument("etcd Txn: empty key");
  std::string k(key);
  FERRY_ASSIGN_OR_RETURN(TxnResult r, Txn({Compare::ValueIs(k, std::string(expected))},
                                          {TxnOp::Put(k, std::string(value), lease)}));
  return r.succeeded;
}

Result<bool> EtcdClient::CompareAndDelete(std::string_view key, int64_t revision) {
  if (key.empty()) return Status::InvalidArgument("etcd Txn: empty key");
  std::string k(key);
  FERRY_ASSIGN_OR_RETURN(TxnResult r,
                         Txn({Compare::ModRevisionIs(k, revision)}, {TxnOp::Delete(k)}));
  return r.succeeded;
}

Result<Lease> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  if (ttl_seconds < 1) return Status::InvalidArgument("etcd LeaseGrant: TTL must be >= 1 s");
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call("LeaseGrant", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    return c.lease->LeaseGrant(&ctx, req, &resp);
  }));
  if (!resp.error().empty()) return Status::Internal("etcd LeaseGrant: " + resp.error());
  FERRY_RETURN_IF_ERROR(RevisionOf(resp.has_header(), resp.header(), "LeaseGrant").status());
  if (resp.id() == 0 || resp.ttl() < 1) {
    return Status::ProtocolError("etcd LeaseGrant: no lease in the reply");
  }
  return Lease{resp.id(), resp.ttl()};
}

Status EtcdClient::LeaseRevoke(LeaseId id) {
  pb::LeaseRevokeRequest req;
  req.set_id(id);
  pb::LeaseRevokeResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call("LeaseRevoke", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    return c.lease->LeaseRevoke(&ctx, req, &resp);
  }));
  return RevisionOf(resp.has_header(), resp.header(), "LeaseRevoke").status();
}

Result<int64_t> EtcdClient::LeaseKeepAliveOnce(LeaseId id) {
  pb::LeaseKeepAliveRequest req;
  req.set_id(id);
  pb::LeaseKeepAliveResponse resp;
  bool answered = false;
  // A stream per renewal, under the call's deadline: no read waits unbounded.
  FERRY_RETURN_IF_ERROR(impl_->Call("LeaseKeepAlive", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    auto stream = c.lease->LeaseKeepAlive(&ctx);
    answered = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    grpc::Status st = stream->Finish();
    if (answered && !st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) return st;
    return answered ? grpc::Status::OK : st;
  }));
  if (!answered) return Status::ProtocolError("etcd LeaseKeepAlive: the stream ended unanswered");
  FERRY_RETURN_IF_ERROR(RevisionOf(resp.has_header(), resp.header(), "LeaseKeepAlive").status());
  if (resp.id() != id) return Status::ProtocolError("etcd LeaseKeepAlive: another lease's reply");
  if (resp.ttl() <= 0) return Status::NotFound("etcd lease " + std::to_string(id) + " expired");
  return resp.ttl();
}

Result<int64_t> EtcdClient::LeaseTimeToLive(LeaseId id) {
  pb::LeaseTimeToLiveRequest req;
  req.set_id(id);
  pb::LeaseTimeToLiveResponse resp;
  FERRY_RETURN_IF_ERROR(impl_->Call("LeaseTimeToLive", [&](EtcdConn& c, grpc::ClientContext& ctx) {
    return c.lease->LeaseTimeToLive(&ctx, req, &resp);
  }));
  FERRY_RETURN_IF_ERROR(RevisionOf(resp.has_header(), resp.header(), "LeaseTimeToLive").status());
  if (resp.id() != id) return Status::ProtocolError("etcd LeaseTimeToLive: another lease's reply");
  if (resp.ttl() < 0) return Status::NotFound("etcd lease " + std::to_string(id) + " expired");
  return resp.ttl();
}

}  // namespace ferry::coord
