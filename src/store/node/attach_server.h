// The node's service to the applications on its host (`ferry node --socket`):
// a Unix stream socket at a filesystem path, speaking the attach
// protocol (store/rpc/attach_wire.h). Each client gets a thread; its memfd
// buffers are mapped once, registered with the node's engine, and referenced
// by id afterwards. A client that goes away loses its buffers (unmapped once
// no operation uses them); its operations in flight finish, committed or
// aborted, so no put stays open for it.
//
// Who may attach: SO_PEERCRED admits the uids (below); with a cluster secret
// (AttachOptions::key) an admitted client must also prove the secret (an
// Auth answering the Hello reply's challenge) before any other request is
// served, and the node proves it back, so a client never shares its memory
// with a process at the path that does not hold it either.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "ferry/status.h"

namespace ferry::log {
class Refusals;
}

namespace ferry::store {

class StoreCore;

struct AttachOptions {
  std::string path;  // the socket's filesystem path
  // Who may attach besides this process's uid and root. Empty: the socket's
  // mode is 0600. Otherwise 0666, and SO_PEERCRED admits only these uids.
  std::vector<uint32_t> allow_uids;
  // Connections served at once, those yet to say Hello included. Past it, and
  // for a uid not allowed, a few are kept to be told why once they say Hello;
  // the rest are closed at once, so a flood costs no thread.
  size_t max_clients = 256;
  // Of those, each uid other than the node's own and root holds at most this
  // many, so that one allowed user cannot lock the others out.
  size_t max_clients_per_uid = 64;
  Millis handshake_timeout{5000};  // a connection must begin its Hello by then
  Millis frame_timeout{5000};      // a frame begun must be complete by then
  size_t max_buffers_per_client = 1024;
  std::string master;  // reported to clients
  // Clients must prove this secret; null: none do (the uid check alone).
  std::shared_ptr<const auth::Key> key = nullptr;
};

class AttachServer {
 public:
  // Binds `options.path` (replacing a stale socket there, never another kind
  // of file) and starts accepting. `core` outlives the server.
  static Result<std::unique_ptr<AttachServer>> Start(StoreCore& core, AttachOptions options);
  // Stops accepting, closes every client and joins its thread, removes the path.
  ~AttachServer();

  const std::string& path() const { return options_.path; }
  size_t clients() const;
  // Clients refused for the cluster secret since Start: no proof, a wrong
  // one, or a request before it. Never blocks.
  uint64_t auth_failures() const;

 private:
  struct Client {
    int fd = -1;
    uint32_t uid = 0;
    bool admitted = false;  // else it is only told why not
    std::thread thread;
    std::atomic<bool> done{false};
  };
  AttachServer(StoreCore& core, AttachOptions options, uint64_t instance);
  void AcceptLoop();
  void Serve(Client* c);
  void Reap(bool all);
  // Empty when a client of `uid` may take a slot; else why not. Under mu_.
  std::string Room(uint32_t uid, bool trusted) const;

  StoreCore& core_;
  const AttachOptions options_;
  const uint64_t instance_;                  // random: tells a client which node it attached to
  std::unique_ptr<log::Refusals> refusals_;  // of the cluster secret
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stops the accept loop
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::list<Client> clients_;  // guarded by mu_
};

}  // namespace ferry::store
