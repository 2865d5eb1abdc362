#include "ferry/store.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/clock.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "store/client/master_client.h"
#include "store/master/master.h"
#include "store/master/service.h"
#include "store/node/node.h"

namespace ferry {

using store::Master;
using store::MasterClient;

namespace {

// The keys that pass Master::CheckKey, to send to the master: ask[j] is
// keys[index[j]].
struct ValidKeys {
  std::vector<std::string> ask;
  std::vector<size_t> index;
};

// Checks every key, each one's status into (*st)[i] (resized to the keys).
ValidKeys CheckKeys(std::span<const std::string> keys, std::vector<Status>* st) {
  ValidKeys v;
  st->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    (*st)[i] = Master::CheckKey(keys[i]);
    if ((*st)[i].ok()) {
      v.ask.push_back(keys[i]);
      v.index.push_back(i);
    }
  }
  return v;
}

// Where a get puts a value: a vector sized on arrival, or a caller buffer.
struct Sink {
  std::vector<uint8_t>* vec = nullptr;
  uint8_t* buf = nullptr;
  size_t cap = 0;
};

struct Source {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

}  // namespace

class Store::Impl {
 public:
  StoreOptions opts;
  std::unique_ptr<store::MasterServer> master_server;  // in-process master, if any
  std::unique_ptr<Engine> engine;
  std::unique_ptr<MasterClient> client;
  std::unique_ptr<store::StoreNode> node;  // embedded node, if any
  std::string master_address;

  std::mutex seg_mu;
  std::unordered_map<std::string, SegmentId> segments;  // guarded by seg_mu
  std::mutex buf_mu;
  std::map<uint64_t, uint64_t> buffers;  // registered caller buffers; guarded by buf_mu

  // Leases of finished gets are ended by a background thread, off the get's
  // path; a remove from this Store sends the pending ones first.
  std::mutex rel_mu;
  std::condition_variable rel_cv;
  std::vector<std::pair<std::string, uint64_t>> rel_queue;  // guarded by rel_mu
  bool rel_stop = false;                                    // guarded by rel_mu
  std::mutex rel_send_mu;  // held while sending, so a flush waits for a send in flight
  std::thread rel_thread;

  ~Impl() {
    if (rel_thread.joinable()) {
      {
        std::lock_guard lock(rel_mu);
        rel_stop = true;
      }
      rel_cv.notify_all();
      rel_thread.join();
    }
  }

  void QueueReleases(std::vector<std::pair<std::string, uint64_t>> leases) {
    {
      std::lock_guard lock(rel_mu);
      for (auto& l : leases) rel_queue.push_back(std::move(l));
    }
    rel_cv.notify_one();
  }

  // Sends every queued release; best effort, since leases end anyway.
  void FlushReleases() {
    std::lock_guard send(rel_send_mu);
    std::vector<std::pair<std::string, uint64_t>> batch;
    {
      std::lock_guard lock(rel_mu);
      batch.swap(rel_queue);
    }
    if (batch.empty()) return;
    auto r = client->ReleaseLeases(batch);
    if (!r.ok()) FERRY_LOG_WARN("store: ending {} leases: {}", batch.size(), r.status().ToString());
  }

  void ReleaseLoop() {
    std::unique_lock lock(rel_mu);
    while (!rel_stop || !rel_queue.empty()) {
      rel_cv.wait_for(lock, Millis(1000), [this] { return rel_stop || !rel_queue.empty(); });
      lock.unlock();
      FlushReleases();
      lock.lock();
    }
  }

  Result<SegmentId> Segment(const std::string& name) {
    {
      std::lock_guard lock(seg_mu);
      auto it = segments.find(name);
      if (it != segments.end()) return it->second;
    }
    FERRY_ASSIGN_OR_RETURN(SegmentId id, engine->OpenSegment(name));
    std::lock_guard lock(seg_mu);
    auto [it, added] = segments.emplace(name, id);
    if (!added) (void)engine->CloseSegment(id);  // another thread opened it meanwhile
    return it->second;
  }

  bool Registered(const void* p, size_t n) {
    const auto a = reinterpret_cast<uint64_t>(p);
    std::lock_guard lock(buf_mu);
    auto it = buffers.upper_bound(a);
    if (it == buffers.begin()) return false;
    --it;
    return a - it->first <= it->second && n <= it->second - (a - it->first);
  }

  bool Local(const StoreExtent& e) const {
    return node != nullptr && e.segment == engine->name() && node->Owns(e.addr, e.length);
  }

  // `out` may arrive with items already failed; those are skipped.
  std::vector<Status> Put(std::span<const std::string> keys, const std::vector<Source>& values,
                          const PutOptions& po, std::vector<Status> out = {});
  std::vector<Result<size_t>> Get(std::span<const std::string> keys, std::vector<Sink>& sinks);
};

// One engine batch over `reqs`; per-request outcome into `out` (OK or the
// error). Requests not done by `deadline` fail with Timeout.
static void RunBatch(Engine& engine, const std::vector<Request>& reqs, Deadline deadline,
                     std::vector<Status>* out) {
  out->assign(reqs.size(), Status::Ok());
  if (reqs.empty()) return;
  auto left = std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline.Remaining()));
  auto batch = engine.Submit(reqs, left);
  if (!batch.ok()) {
    out->assign(reqs.size(), batch.status());
    return;
  }
  (void)batch.value()->Wait(left + Millis(100));
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestResult r = batch.value()->Result(i);
    if (!r.done) {
      (*out)[i] = Status(StatusCode::kTimeout, "transfer not done before the deadline");
    } else if (!r.status.ok()) {
      (*out)[i] = r.status;
    }
  }
  // Freeing the batch cancels what is left and waits until no buffer is touched.
}

std::vector<Status> Store::Impl::Put(std::span<const std::string> keys,
                                     const std::vector<Source>& values, const PutOptions& po,
                                     std::vector<Status> out) {
  out.resize(keys.size());
  if (values.size() != keys.size()) {
    out.assign(keys.size(),
               Status(StatusCode::kInvalidArgument, "keys and values differ in count"));
    return out;
  }
  std::vector<store::PutRequestItem> items;
  std::vector<size_t> index;  // items[j] is keys[index[j]]
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i].ok()) continue;
    out[i] = Master::CheckKey(keys[i]);
    if (out[i].ok() && (values[i].size == 0 || values[i].data == nullptr)) {
      out[i] = Status(StatusCode::kInvalidArgument, "empty value");
    }
    if (!out[i].ok()) continue;
    store::PutRequestItem it;
    it.key = keys[i];
    it.size = values[i].size;
    it.replicas = po.replicas == 0 ? opts.replicas : po.replicas;
    it.preferred = po.preferred_segment;
    it.pin = po.pin;
    it.pin_ttl = po.pin_ttl;
    items.push_back(std::move(it));
    index.push_back(i);
  }
  if (items.empty()) return out;
  const auto t0 = Clock::now();
  const bool prefer_local = opts.prefer_local && node != nullptr;
  auto grants = client->PutBegin(items, prefer_local ? engine->name() : "", prefer_local);
  if (!grants.ok()) {
    for (size_t i : index) out[i] = grants.status();
    return out;
  }
  auto& g = grants.value();
  // Every replica's bytes: copied here for this process's memory, else one
  // engine batch for all.
  std::vector<Request> reqs;
  std::vector<size_t> owner;
  Clock::time_point end = Clock::time_point::max();  // the first put timeout
  for (size_t j = 0; j < items.size(); ++j) {
    Status& st = out[index[j]];
    st = g[j].status;
    if (!st.ok()) continue;
    end = std::min(end, t0 + g[j].timeout);
    const Source& src = values[index[j]];
    for (const auto& rep : g[j].replicas) {
      uint64_t off = 0;
      for (const auto& e : rep.extents) {
        if (Local(e)) {
          std::memcpy(reinterpret_cast<void*>(e.addr), src.data + off, e.length);
        } else if (auto seg = Segment(e.segment); !seg.ok()) {
          st = seg.status();
        } else {
          reqs.push_back(
              {Op::kWrite, const_cast<uint8_t*>(src.data + off), seg.value(), e.addr, e.length});
          owner.push_back(j);
        }
        off += e.length;
      }
    }
  }
  std::vector<Status> moved;
  RunBatch(*engine, reqs, Deadline(end), &moved);
  for (size_t r = 0; r < reqs.size(); ++r) {
    Status& st = out[index[owner[r]]];
    if (st.ok() && !moved[r].ok()) st = moved[r];
  }
  // Commit what arrived everywhere, abort the rest: all or nothing per value.
  std::vector<store::PutEndItem> ends;
  std::vector<size_t> end_index;
  for (size_t j = 0; j < items.size(); ++j) {
    if (!g[j].status.ok()) continue;
    ends.push_back({items[j].key, g[j].put_id, out[index[j]].ok()});
    end_index.push_back(index[j]);
  }
  if (ends.empty()) return out;
  auto ended = client->PutEnd(ends);
  for (size_t k = 0; k < ends.size(); ++k) {
    Status& st = out[end_index[k]];
    if (!ends[k].commit) continue;
    st = ended.ok() ? ended.value()[k] : ended.status();
  }
  return out;
}

std::vector<Result<size_t>> Store::Impl::Get(std::span<const std::string> keys,
                                             std::vector<Sink>& sinks) {
  std::vector<Status> st;
  const auto [ask, index] = CheckKeys(keys, &st);
  std::vector<uint64_t> sizes(keys.size(), 0);
  const auto t0 = Clock::now();
  std::vector<store::GetItem> found;
  if (!ask.empty()) {
    auto r = client->Get(ask);
    if (!r.ok()) {
      for (size_t i : index) st[i] = r.status();
    } else {
      found = std::move(r).value();
    }
  }
  // Replica order per item: one in this process first.
  std::vector<std::vector<size_t>> order(found.size());
  std::vector<uint8_t*> dst(found.size(), nullptr);
  Clock::time_point lease_end = Clock::time_point::max();  // the first lease to end
  for (size_t j = 0; j < found.size(); ++j) {
    const size_t i = index[j];
    st[i] = found[j].status;
    if (!st[i].ok()) continue;
    const ObjectLocation& loc = found[j].location;
    sizes[i] = loc.size;
    Sink& s = sinks[i];
    if (s.vec != nullptr) {
      try {
        s.vec->resize(loc.size);
      } catch (const std::bad_alloc&) {
        st[i] = Status(StatusCode::kResourceExhausted,
                       "cannot allocate " + std::to_string(loc.size) + " bytes for the value");
        continue;
      }
      dst[j] = s.vec->data();
    } else if (s.cap < loc.size) {
      st[i] =
          Status(StatusCode::kOutOfRange, "buffer of " + std::to_string(s.cap) +
                                              " bytes; the value has " + std::to_string(loc.size));
      continue;
    } else {
      dst[j] = s.buf;
    }
    lease_end = std::min(lease_end, t0 + loc.lease);
    for (size_t r = 0; r < loc.replicas.size(); ++r) {
      const bool local = Local(loc.replicas[r].extents.front());
      if (local) {
        order[j].insert(order[j].begin(), r);
      } else {
        order[j].push_back(r);
      }
    }
  }
  const Deadline deadline(lease_end);
  if (opts.read_delay.count() > 0) std::this_thread::sleep_for(opts.read_delay);
  // Rounds: each item reads its next replica until one succeeds.
  std::vector<size_t> pending;
  for (size_t j = 0; j < found.size(); ++j) {
    if (!st[index[j]].ok()) continue;
    if (deadline.Expired()) {
      st[index[j]] = Status(StatusCode::kTimeout, "the lease ended before the read began");
    } else {
      pending.push_back(j);
    }
  }
  for (size_t round = 0; !pending.empty(); ++round) {
    std::vector<Request> reqs;
    std::vector<size_t> owner;
    std::vector<Status> item(found.size());
    for (size_t j : pending) {
      const StoreReplica& rep = found[j].location.replicas[order[j][round]];
      uint64_t off = 0;
      for (const auto& e : rep.extents) {
        if (Local(e)) {
          std::memcpy(dst[j] + off, reinterpret_cast<const void*>(e.addr), e.length);
        } else if (auto seg = Segment(e.segment); !seg.ok()) {
          item[j] = seg.status();
        } else {
          reqs.push_back({Op::kRead, dst[j] + off, seg.value(), e.addr, e.length});
          owner.push_back(j);
        }
        off += e.length;
      }
    }
    std::vector<Status> moved;
    RunBatch(*engine, reqs, deadline, &moved);
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (item[owner[r]].ok() && !moved[r].ok()) item[owner[r]] = moved[r];
    }
    std::vector<size_t> next;
    for (size_t j : pending) {
      if (item[j].ok()) continue;
      if (round + 1 < order[j].size() && !deadline.Expired()) {
        next.push_back(j);
      } else {
        st[index[j]] = item[j];
      }
    }
    pending = std::move(next);
  }
  // The lease is what kept the bytes from being reused while we read them.
  const bool late = deadline.Expired();
  // Done reading: end the leases soon rather than at their term, so that the
  // space can be evicted or the key removed.
  std::vector<std::pair<std::string, uint64_t>> leases;
  for (size_t j = 0; j < found.size(); ++j) {
    if (found[j].status.ok()) leases.emplace_back(keys[index[j]], found[j].lease_id);
  }
  if (!leases.empty()) QueueReleases(std::move(leases));
  std::vector<Result<size_t>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i].ok() && late) {
      st[i] = Status(StatusCode::kTimeout,
                     "the read outlived its lease; the bytes may have been reused");
    }
    out.push_back(st[i].ok() ? Result<size_t>(sizes[i]) : Result<size_t>(st[i]));
  }
  return out;
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::Create(StoreOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  if (options.replicas == 0) {
    return Status(StatusCode::kInvalidArgument, "replicas must be at least 1");
  }
  if (options.master.empty()) {
    store::MasterServerOptions mo;
    mo.http_port = -1;
    mo.master.lease = options.lease;
    mo.master.put_timeout = options.put_timeout;
    mo.master.node_ttl = options.node_ttl;
    FERRY_ASSIGN_OR_RETURN(impl->master_server, store::MasterServer::Start(mo));
    impl->master_address = impl->master_server->address();
  } else {
    impl->master_address = options.master;
  }
  FERRY_ASSIGN_OR_RETURN(impl->engine, Engine::Create(options.engine));
  FERRY_ASSIGN_OR_RETURN(impl->client,
                         MasterClient::Connect(impl->master_address, options.rpc_timeout));
  impl->rel_thread = std::thread([p = impl.get()] {
    NameThisThread("ferry-release");
    p->ReleaseLoop();
  });
  if (options.local_memory > 0) {
    store::NodeOptions no;
    no.master = impl->master_address;
    no.segment_size = options.local_memory;
    no.heartbeat = options.heartbeat;
    no.rpc_timeout = options.rpc_timeout;
    FERRY_ASSIGN_OR_RETURN(impl->node, store::StoreNode::Start(*impl->engine, no, true));
  }
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

const std::string& Store::segment() const { return impl_->engine->name(); }
const std::string& Store::master_address() const { return impl_->master_address; }

Status Store::RegisterBuffer(void* data, size_t size) {
  FERRY_RETURN_IF_ERROR(impl_->engine->RegisterMemory(data, size));
  std::lock_guard lock(impl_->buf_mu);
  impl_->buffers[reinterpret_cast<uint64_t>(data)] = size;
  return Status::Ok();
}

Status Store::UnregisterBuffer(void* data) {
  FERRY_RETURN_IF_ERROR(impl_->engine->UnregisterMemory(data));
  std::lock_guard lock(impl_->buf_mu);
  impl_->buffers.erase(reinterpret_cast<uint64_t>(data));
  return Status::Ok();
}

Status Store::Put(std::string_view key, std::span<const uint8_t> value, const PutOptions& o) {
  std::string k(key);
  return impl_->Put({&k, 1}, {Source{value.data(), value.size()}}, o)[0];
}

Result<std::vector<uint8_t>> Store::Get(std::string_view key) {
  auto r = BatchGet(std::vector<std::string>{std::string(key)});
  return std::move(r[0]);
}

Status Store::PutFrom(std::string_view key, StoreBuffer buffer, const PutOptions& o) {
  return BatchPutFrom(std::vector<std::string>{std::string(key)}, {&buffer, 1}, o)[0];
}

Result<size_t> Store::GetInto(std::string_view key, StoreBuffer buffer) {
  return BatchGetInto(std::vector<std::string>{std::string(key)}, {&buffer, 1})[0];
}

Status Store::Exists(std::string_view key) {
  return BatchExists(std::vector<std::string>{std::string(key)})[0];
}

Status Store::Remove(std::string_view key, bool force) {
  return BatchRemove(std::vector<std::string>{std::string(key)}, force)[0];
}

Result<ObjectLocation> Store::Locate(std::string_view key) {
  return std::move(BatchLocate(std::vector<std::string>{std::string(key)})[0]);
}

Status Store::Pin(std::string_view key, StorePin pin, std::chrono::milliseconds ttl) {
  return BatchPin(std::vector<std::string>{std::string(key)}, pin, ttl)[0];
}

std::vector<Status> Store::BatchPut(std::span<const std::string> keys,
                                    std::span<const std::span<const uint8_t>> values,
                                    const PutOptions& o) {
  std::vector<Source> src;
  for (const auto& v : values) src.push_back({v.data(), v.size()});
  return impl_->Put(keys, src, o);
}

std::vector<Result<std::vector<uint8_t>>> Store::BatchGet(std::span<const std::string> keys) {
  std::vector<std::vector<uint8_t>> vals(keys.size());
  std::vector<Sink> sinks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) sinks[i].vec = &vals[i];
  auto got = impl_->Get(keys, sinks);
  std::vector<Result<std::vector<uint8_t>>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out.push_back(got[i].ok() ? Result<std::vector<uint8_t>>(std::move(vals[i]))
                              : Result<std::vector<uint8_t>>(got[i].status()));
  }
  return out;
}

std::vector<Status> Store::BatchPutFrom(std::span<const std::string> keys,
                                        std::span<const StoreBuffer> buffers, const PutOptions& o) {
  std::vector<Source> src;
  std::vector<Status> pre(keys.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    src.push_back({static_cast<const uint8_t*>(buffers[i].data), buffers[i].size});
    if (i < keys.size() && !impl_->Registered(buffers[i].data, buffers[i].size)) {
      pre[i] = Status(StatusCode::kInvalidArgument, "buffer is not inside a registered buffer");
    }
  }
  return impl_->Put(keys, src, o, std::move(pre));
}

std::vector<Result<size_t>> Store::BatchGetInto(std::span<const std::string> keys,
                                                std::span<const StoreBuffer> buffers) {
  std::vector<Sink> sinks(keys.size());
  std::vector<bool> bad(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= buffers.size() || !impl_->Registered(buffers[i].data, buffers[i].size)) {
      bad[i] = true;
      continue;
    }
    sinks[i] = {nullptr, static_cast<uint8_t*>(buffers[i].data), buffers[i].size};
  }
  auto out = impl_->Get(keys, sinks);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (bad[i]) {
      out[i] = Status(StatusCode::kInvalidArgument, "buffer is not inside a registered buffer");
    }
  }
  return out;
}

// Validates the keys here, sends the valid ones in one master call, and maps
// the answers back: one status per key, in order.
template <typename F>
static std::vector<Status> KeyCall(std::span<const std::string> keys, F&& call) {
  std::vector<Status> out;
  const auto [ask, index] = CheckKeys(keys, &out);
  if (ask.empty()) return out;
  Result<std::vector<Status>> r = call(ask);
  for (size_t j = 0; j < ask.size(); ++j) out[index[j]] = r.ok() ? r.value()[j] : r.status();
  return out;
}

std::vector<Status> Store::BatchExists(std::span<const std::string> keys) {
  return KeyCall(keys, [&](const std::vector<std::string>& k) { return impl_->client->Exists(k); });
}

std::vector<Status> Store::BatchRemove(std::span<const std::string> keys, bool force) {
  impl_->FlushReleases();  // this Store's finished reads no longer hold the keys
  return KeyCall(
      keys, [&](const std::vector<std::string>& k) { return impl_->client->Remove(k, force); });
}

std::vector<Status> Store::BatchPin(std::span<const std::string> keys, StorePin pin,
                                    std::chrono::milliseconds ttl) {
  return KeyCall(
      keys, [&](const std::vector<std::string>& k) { return impl_->client->Pin(k, pin, ttl); });
}

std::vector<Result<ObjectLocation>> Store::BatchLocate(std::span<const std::string> keys) {
  std::vector<Status> st;
  const auto [ask, index] = CheckKeys(keys, &st);
  // The valid keys' results are all set from the master's answer below.
  std::vector<Result<ObjectLocation>> out(st.begin(), st.end());
  if (ask.empty()) return out;
  auto r = impl_->client->Get(ask);
  for (size_t j = 0; j < ask.size(); ++j) {
    if (!r.ok()) {
      out[index[j]] = r.status();
    } else if (!r.value()[j].status.ok()) {
      out[index[j]] = r.value()[j].status;
    } else {
      out[index[j]] = std::move(r.value()[j].location);
    }
  }
  return out;
}

}  // namespace ferry
