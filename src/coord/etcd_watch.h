// A watch on an etcd key or prefix: changes arrive in order on a thread of
// the watch's own, and a broken stream resumes at the next endpoint from the
// revision after the last one delivered, so nothing is missed or repeated.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coord/etcd_client.h"
#include "ferry/status.h"

namespace grpc {
class ClientContext;
}

namespace ferry::coord {

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: the key and the revision of the deletion only
};

struct WatchUpdate {
  std::vector<WatchEvent> events;  // in revision order
  int64_t revision = 0;            // the store's revision this update reaches
  // etcd no longer holds the revisions the watch would resume from
  // (compacted): changes may have been missed, so the receiver re-reads
  // what it follows. `events` is empty then.
  bool resync = false;
};

class EtcdWatch {
 public:
  using Callback = std::function<void(const WatchUpdate&)>;

  // Watches `key`, or every key starting with it when `prefix`, from
  // `start_revision` (0: changes after now). Returns once etcd has confirmed
  // the watch, so every later change is delivered; Unavailable or Timeout
  // (as EtcdClient) when no endpoint confirms it in the client's call
  // timeout per endpoint. `callback` runs on the watch's thread, one update
  // at a time; it must not destroy the watch.
  static Result<std::unique_ptr<EtcdWatch>> Start(std::shared_ptr<EtcdClient> client,
                                                  std::string key, bool prefix,
                                                  int64_t start_revision, Callback callback);
  // Cancels the stream and joins the thread: no callback runs after it returns.
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The revision the watch resumes after: the last it delivered or was told
  // it had reached.
  int64_t revision() const { return next_revision_.load() - 1; }
  // Streams that broke and were made again since Start; for monitoring.
  uint64_t reconnects() const { return reconnects_.load(); }

 private:
  EtcdWatch(std::shared_ptr<EtcdClient> client, std::string key, bool prefix,
            int64_t start_revision, Callback callback);
  void Run();
  // One stream at endpoint `idx`, until it breaks or the watch stops.
  Status Session(size_t idx);
  Status Deliver(const void* response);  // an etcdserverpb::WatchResponse
  // Waits `d` or until stopping; false when stopping.
  bool Pause(Millis d);

  const std::shared_ptr<EtcdClient> client_;
  const std::string key_;
  const bool prefix_;
  const Callback callback_;
  std::atomic<int64_t> next_revision_;  // 0: from now
  std::atomic<uint64_t> reconnects_{0};
  bool resync_due_ = false;  // the thread's own

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;               // guarded by mu_
  grpc::ClientContext* ctx_ = nullptr;  // the stream's, to cancel; guarded by mu_
  bool confirmed_ = false;              // guarded by mu_
  size_t first_failures_ = 0;           // before the first confirmation; guarded by mu_
  Status first_error_;                  // guarded by mu_
  std::thread thread_;
};

}  // namespace ferry::coord
