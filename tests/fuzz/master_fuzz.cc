// The master's gRPC service (store/master/service.cc) over a real Master: a
// fresh one per input, which is a sequence of calls, each a method byte, a
// u16 length and that many bytes parsed as the method's request (bytes that
// do not parse are what gRPC itself would refuse, and are skipped). The
// handlers are called directly, with no transport in between. A socket call
// (kSocket) goes through the socket's dispatch instead: its payload split
// into token and request, parsed, and run as the same method.
//
// Checked after every call: only OK or INVALID_ARGUMENT (INTERNAL means
// something threw), one result per item, known status codes and no Internal
// (a failure of the master's own, never the caller's doing), and grants that
// hold: each replica's extents add up to the object's size, lie in the
// regions its node mounted, sit on one node per replica and distinct nodes
// per object, and no two extents of one answer overlap.
//
// The service lives in service.cc's anonymous namespace, so the file is
// compiled here, as part of this target (and service.cc is not linked).
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "fuzz.h"
#include "store/master/service.cc"

namespace ferry::store {
namespace {

enum Method : uint8_t {
  kMount,
  kHeartbeat,
  kUnmount,
  kPutBegin,
  kPutEnd,
  kGet,
  kReleaseLeases,
  kExists,
  kRemove,
  kPin,
  kRemoveAll,
  kStats,
  kTick,    // the master's background work, not a call
  kSocket,  // a socket call (master_wire.h): type byte, then the frame's payload
  kMethods,
};

// Internal is never the caller's doing: it means a failure of the master's own.
void CheckStatus(const pb::ItemStatus& s) {
  FUZZ_CHECK(s.code() <= static_cast<uint32_t>(kLastStatusCode) &&
                 s.code() != static_cast<uint32_t>(StatusCode::kInternal),
             "status code %u: %s", s.code(), s.message().c_str());
}

template <typename Results>
void CheckStatuses(const Results& results, int items) {
  FUZZ_CHECK(results.size() == items, "%d results for %d items", results.size(), items);
  for (const auto& s : results) CheckStatus(s);
}

// The service with no cluster secret and no socket port (the master has no gate).
std::unique_ptr<Service> MakeService(Master& m) {
  static const std::atomic<int> kNoSocket{0};
  return std::make_unique<Service>(m, nullptr, kNoSocket);
}

class Harness {
 public:
  explicit Harness(const MasterOptions& o) : master_(o), service_(MakeService(master_)) {}

  void Call(uint8_t method, const uint8_t* p, size_t n) {
    switch (method % kMethods) {
      case kMount: {
        pb::MountRequest q;
        pb::MountResponse r;
        if (!q.ParseFromArray(p, static_cast<int>(n))) return;
        if (!Ok(service_->Mount(&ctx_, &q, &r))) return;
        CheckStatus(r.status());
        if (r.status().code() != 0) return;
        auto& regions = mounts_[q.node()];
        regions.clear();
        for (const auto& g : q.regions()) regions.emplace_back(g.base(), g.size());
        return;
      }
      case kHeartbeat:
      case kUnmount: {
        pb::NodeRequest q;
        pb::NodeResponse r;
        if (!q.ParseFromArray(p, static_cast<int>(n))) return;
        const bool unmount = method % kMethods == kUnmount;
        if (!Ok(unmount ? service_->Unmount(&ctx_, &q, &r) : service_->Heartbeat(&ctx_, &q, &r))) {
          return;
        }
        CheckStatus(r.status());
        if (unmount && r.status().code() == 0) mounts_.erase(q.node());
        return;
      }
      case kPutBegin: {
        pb::PutBeginRequest q;
        pb::PutBeginResponse r;
        if (!q.ParseFromArray(p, static_cast<int>(n))) return;
        if (!Ok(service_->PutBegin(&ctx_, &q, &r))) return;
        FUZZ_CHECK(r.results_size() == q.items_size(), "PutBegin: %d results for %d items",
                   r.results_size(), q.items_size());
        Extents all;
        for (int i = 0; i < r.results_size(); ++i) {
          const auto& res = r.results(i);
          CheckStatus(res.status());
          if (res.status().code() != 0) continue;
          const auto& item = q.items(i);
          const int want = item.replicas() == 0 ? 1 : static_cast<int>(item.replicas());
          FUZZ_CHECK(res.replicas_size() == want, "PutBegin: %d replicas for %d asked",
                     res.replicas_size(), want);
          CheckReplicas(res.replicas(), item.size(), &all);
        }
        return;
      }
      case kPutEnd: return Statuses(p, n, &Service::PutEnd, &pb::PutEndRequest::items_size);
      case kGet: {
        pb::KeysRequest q;
        pb::GetResponse r;
        if (!q.ParseFromArray(p, static_cast<int>(n))) return;
        if (!Ok(service_->Get(&ctx_, &q, &r))) return;
        FUZZ_CHECK(r.results_size() == q.keys_size(), "Get: %d results for %d keys",
                   r.results_size(), q.keys_size());
        for (const auto& res : r.results()) {
          CheckStatus(res.status());
          if (res.status().code() != 0) continue;
          FUZZ_CHECK(res.replicas_size() > 0, "Get: an object without replicas");
          Extents all;
          CheckReplicas(res.replicas(), res.size(), &all);
        }
        return;
      }
      case kReleaseLeases:
        return Statuses(p, n, &Service::ReleaseLeases, &pb::ReleaseRequest::items_size);
      case kExists: return Statuses(p, n, &Service::Exists, &pb::KeysRequest::keys_size);
      case kRemove: return Statuses(p, n, &Service::Remove, &pb::RemoveRequest::keys_size);
      case kPin: return Statuses(p, n, &Service::Pin, &pb::PinRequest::items_size);
      case kRemoveAll: {
        pb::RemoveAllRequest q;
        pb::RemoveAllResponse r;
        if (!q.ParseFromArray(p, static_cast<int>(n))) return;
        (void)Ok(service_->RemoveAll(&ctx_, &q, &r));
        return;
      }
      case kStats: {
        pb::StatsRequest q;
        pb::StatsResponse r;
        if (!q.ParseFromArray(p, static_cast<int>(n))) return;
        if (!Ok(service_->Stats(&ctx_, &q, &r))) return;
        FUZZ_CHECK(r.used() <= r.capacity(), "Stats: %llu bytes used of %llu",
                   static_cast<unsigned long long>(r.used()),
                   static_cast<unsigned long long>(r.capacity()));
        FUZZ_CHECK(r.nodes() == mounts_.size() || master_.options().node_ttl.count() == 0,
                   "Stats: %llu nodes, %zu mounted", static_cast<unsigned long long>(r.nodes()),
                   mounts_.size());
        return;
      }
      case kTick: master_.Tick(); return;
      case kSocket: {
        if (n == 0) return;
        framing::Frame f;
        f.type = p[0];
        f.payload.assign(p + 1, p + n);
        const SocketReply r = ServeSocket(*service_, *service_, f, "fuzz");
        FUZZ_CHECK(r.code != StatusCode::kInternal, "socket call %u: Internal", f.type);
        FUZZ_CHECK(r.payload.size() <= master_wire::kMaxPayload, "socket reply of %zu bytes",
                   r.payload.size());
        return;
      }
    }
  }

 private:
  using Extents = std::vector<std::tuple<std::string, uint64_t, uint64_t>>;  // node, [begin, end)

  // A call answered with one status per item.
  template <typename Req, typename Resp>
  void Statuses(const uint8_t* p, size_t n,
                grpc::Status (Service::*method)(grpc::ServerContext*, const Req*, Resp*),
                int (Req::*items)() const) {
    Req q;
    Resp r;
    if (!q.ParseFromArray(p, static_cast<int>(n))) return;
    if (Ok(((*service_).*method)(&ctx_, &q, &r))) CheckStatuses(r.results(), (q.*items)());
  }

  // A handler may refuse a request as a whole, and nothing else.
  static bool Ok(const grpc::Status& st) {
    FUZZ_CHECK(st.ok() || st.error_code() == grpc::StatusCode::INVALID_ARGUMENT,
               "gRPC status %d: %s", static_cast<int>(st.error_code()), st.error_message().c_str());
    return st.ok();
  }

  // Replicas of one object of `size` bytes; their extents join `all`, those
  // of the whole answer, which must not overlap.
  template <typename Replicas>
  void CheckReplicas(const Replicas& replicas, uint64_t size, Extents* all) {
    std::vector<std::string> nodes;
    for (const auto& rep : replicas) {
      FUZZ_CHECK(rep.extents_size() > 0, "a replica without extents");
      const std::string& node = rep.extents(0).segment();
      FUZZ_CHECK(std::find(nodes.begin(), nodes.end(), node) == nodes.end(),
                 "two replicas on node %s", node.c_str());
      nodes.push_back(node);
      uint64_t total = 0;
      for (const auto& e : rep.extents()) {
        FUZZ_CHECK(e.segment() == node, "a replica across nodes %s and %s", node.c_str(),
                   e.segment().c_str());
        FUZZ_CHECK(e.length() > 0 && e.addr() + e.length() > e.addr(), "extent 0x%llx+%llu",
                   static_cast<unsigned long long>(e.addr()),
                   static_cast<unsigned long long>(e.length()));
        FUZZ_CHECK(InMount(node, e.addr(), e.length()),
                   "extent 0x%llx+%llu outside what node %s mounted",
                   static_cast<unsigned long long>(e.addr()),
                   static_cast<unsigned long long>(e.length()), node.c_str());
        for (const auto& [n, b, en] : *all) {
          FUZZ_CHECK(n != node || en <= e.addr() || e.addr() + e.length() <= b,
                     "two extents of one answer overlap at 0x%llx on node %s",
                     static_cast<unsigned long long>(e.addr()), node.c_str());
        }
        all->emplace_back(node, e.addr(), e.addr() + e.length());
        total += e.length();
      }
      FUZZ_CHECK(total == size, "a replica of %llu bytes for an object of %llu",
                 static_cast<unsigned long long>(total), static_cast<unsigned long long>(size));
    }
  }

  bool InMount(const std::string& node, uint64_t addr, uint64_t length) const {
    auto it = mounts_.find(node);
    if (it == mounts_.end()) return false;
    for (const auto& [base, sz] : it->second) {
      if (addr >= base && length <= sz && addr - base <= sz - length) return true;
    }
    return false;
  }

  Master master_;
  std::unique_ptr<Service> service_;
  grpc::ServerContext ctx_;
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> mounts_;
};

// A fresh master for each input, so that an input means the same every time.
void FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  MasterOptions o;
  o.shards = 4;
  o.tick = Millis(3600 * 1000);  // background work only when the input asks
  if (data[0] & 1) {             // everything expires at once
    o.lease = o.put_timeout = o.write_grace = o.node_ttl = Millis(0);
  }
  Harness h(o);
  size_t pos = 1;
  while (size - pos >= 3) {
    const uint8_t method = data[pos];
    const size_t n = std::min<size_t>(fuzz::GetLe(data + pos + 1, 2), size - pos - 3);
    h.Call(method, data + pos + 3, n);
    pos += 3 + n;
  }
}

}  // namespace
}  // namespace ferry::store

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf logs every string field that is not UTF-8, as gRPC would refuse it.
  static const bool quiet =
      (ferry::fuzz::QuietLogs(), google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  ferry::store::FuzzOne(data, size);
  return 0;
}
