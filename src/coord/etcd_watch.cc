#include "coord/etcd_watch.h"

#include <algorithm>

#include "common/log.h"
#include "coord/etcd_conn.h"

namespace ferry::coord {
namespace {
constexpr Millis kRetryMin{100};
constexpr Millis kRetryMax{1000};
}  // namespace

Result<std::unique_ptr<EtcdWatch>> EtcdWatch::Start(std::shared_ptr<EtcdClient> client,
                                                    std::string key, bool prefix,
                                                    int64_t start_revision, Callback callback) {
  if (key.empty() && !prefix) return Status::InvalidArgument("etcd Watch: empty key");
  if (start_revision < 0) return Status::InvalidArgument("etcd Watch: negative revision");
  const size_t endpoints = client->impl().size();
  const Millis per = client->options().call_timeout;
  std::unique_ptr<EtcdWatch> w(new EtcdWatch(std::move(client), std::move(key), prefix,
                                             start_revision, std::move(callback)));
  w->thread_ = std::thread([p = w.get()] { p->Run(); });
  std::unique_lock lk(w->mu_);
  const bool settled = w->cv_.wait_for(lk, per * static_cast<int>(endpoints) + per, [&] {
    return w->confirmed_ || w->first_failures_ >= endpoints;
  });
  if (w->confirmed_) return w;
  Status st = settled ? w->first_error_
                      : Status::Timeout("etcd Watch: not confirmed within " +
                                        std::to_string(per.count() * (endpoints + 1)) + " ms");
  lk.unlock();
  w.reset();  // stops the thread
  return st;
}

EtcdWatch::EtcdWatch(std::shared_ptr<EtcdClient> client, std::string key, bool prefix,
                     int64_t start_revision, Callback callback)
    : client_(std::move(client)),
      key_(std::move(key)),
      prefix_(prefix),
      callback_(std::move(callback)),
      next_revision_(start_revision) {}

EtcdWatch::~EtcdWatch() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool EtcdWatch::Pause(Millis d) {
  std::unique_lock lk(mu_);
  return !cv_.wait_for(lk, d, [&] { return stopping_; });
}

void EtcdWatch::Run() {
  auto& impl = client_->impl();
  size_t idx = impl.current();
  Millis backoff = kRetryMin;
  std::string last_error;
  while (true) {
    Status st = Session(idx);
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      if (!confirmed_) {
        first_error_ = st;
        ++first_failures_;
        cv_.notify_all();
      }
    }
    // Logged when it changes, not at every retry of an etcd that is down.
    if (st.message() != last_error) {
      const int64_t rev = revision();
      FERRY_LOG_WARN("etcd watch on {}: {}; resuming {}", key_, st.ToString(),
                     rev > 0 ? "after revision " + std::to_string(rev) : std::string("from now"));
      last_error = st.message();
    }
    reconnects_.fetch_add(1);
    impl.Revive(idx);
    idx = (idx + 1) % impl.size();
    if (!Pause(backoff)) return;
    backoff = std::min(kRetryMax, backoff * 2);
    if (st.code() == StatusCode::kOk) backoff = kRetryMin;  // it had been working
  }
}

Status EtcdWatch::Session(size_t idx) {
  const std::shared_ptr<EtcdConn> conn = client_->impl().conn(idx);
  grpc::ClientContext ctx;  // no deadline: the stream lives as long as the watch
  {
    std::lock_guard lk(mu_);
    if (stopping_) return Status::Cancelled("stopping");
    ctx_ = &ctx;
  }
  struct Clear {
    EtcdWatch* w;
    ~Clear() {
      std::lock_guard lk(w->mu_);
      w->ctx_ = nullptr;
    }
  } clear{this};

  auto stream = conn->watch->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key_);
  if (prefix_) create->set_range_end(PrefixEnd(key_));
  create->set_start_revision(next_revision_.load());
  create->set_progress_notify(true);
  etcdserverpb::WatchResponse resp;
  Status st = Status::Ok();
  bool created = false;
  int64_t id = 0;
  if (stream->Write(req)) {
    while (stream->Read(&resp)) {
      if (!created) {
        if (!resp.created()) {
          st = Status::ProtocolError("etcd Watch: an update before the confirmation");
          break;
        }
        created = true;
        id = resp.watch_id();
        {
          std::lock_guard lk(mu_);
          confirmed_ = true;
        }
        cv_.notify_all();
      } else if (resp.watch_id() != id) {
        st = Status::ProtocolError("etcd Watch: an update of another watch");
        break;
      }
      if (resp.canceled()) {
        if (resp.compact_revision() > 0) {
          // Resume from now, then tell the receiver to re-read (once the new
          // stream is confirmed, so nothing after the re-read is missed).
          next_revision_.store(0);
          resync_due_ = true;
          st = Status::NotFound("etcd Watch: revisions compacted up to " +
                                std::to_string(resp.compact_revision()));
        } else {
          st = Status::Cancelled("etcd Watch cancelled: " + resp.cancel_reason());
        }
        break;
      }
      st = Deliver(&resp);
      if (!st.ok()) break;
    }
  }
  ctx.TryCancel();
  grpc::Status gs = stream->Finish();
  if (!st.ok()) return st;
  if (!gs.ok()) return FromGrpc(gs, "Watch", conn->endpoint);
  return Status::Unavailable("etcd Watch at " + conn->endpoint + ": the stream ended");
}

Status EtcdWatch::Deliver(const void* response) {
  const auto& resp = *static_cast<const etcdserverpb::WatchResponse*>(response);
  if (!resp.has_header() || resp.header().revision() < 1) {
    return Status::ProtocolError("etcd Watch: an update without a revision");
  }
  WatchUpdate up;
  up.revision = resp.header().revision();
  const int64_t from = next_revision_.load();
  int64_t last = std::max<int64_t>(from, 1);  // no event may come before it
  for (const auto& e : resp.events()) {
    const auto& kv = e.kv();
    const bool in_range = prefix_ ? kv.key().starts_with(key_) : kv.key() == key_;
    if (!in_range || kv.mod_revision() < last || kv.mod_revision() > up.revision ||
        (e.type() != mvccpb::Event::PUT && e.type() != mvccpb::Event::DELETE)) {
      return Status::ProtocolError("etcd Watch: an event out of range or order");
    }
    last = kv.mod_revision();
    WatchEvent ev;
    ev.type = e.type() == mvccpb::Event::PUT ? WatchEvent::Type::kPut : WatchEvent::Type::kDelete;
    ev.kv = {kv.key(),          kv.value(),   kv.create_revision(),
             kv.mod_revision(), kv.version(), kv.lease()};
    up.events.push_back(std::move(ev));
  }
  // After events, resume past the last one. A progress notice (no events)
  // promises every later event a higher revision than its header's, and so
  // does the confirmation of a watch from now; that of a watch from a past
  // revision does not: the events since then are still to come.
  int64_t next = from;
  if (!up.events.empty()) {
    next = last + 1;
  } else if (!resp.created() || from == 0) {
    next = up.revision + 1;
  }
  if (next > from) next_revision_.store(next);
  if (resync_due_) {
    resync_due_ = false;
    WatchUpdate r;
    r.revision = up.revision;
    r.resync = true;
    callback_(r);
  }
  if (!up.events.empty()) callback_(up);
  return Status::Ok();
}

}  // namespace ferry::coord
