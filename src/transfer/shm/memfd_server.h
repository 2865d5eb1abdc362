// The owner's side of peer_memfd.h: a Unix socket in the abstract namespace
// that hands same-host peers the memfds of this engine's registered buffers,
// and of its generation page, as SCM_RIGHTS. It admits its own uid and root
// (SO_PEERCRED), answers only for a memfd registered now under the region and
// serial asked for, and runs on a thread of its own: the engine's io threads
// never wait for it, and it never keeps them from stopping. A malformed
// request, a refused one, or one that does not arrive within the timeout
// closes that connection only.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/clock.h"
#include "ferry/status.h"

namespace asio {
class io_context;
}

namespace ferry {

class MemoryRegistry;

class MemfdServer {
 public:
  // Listens on a fresh name and starts its thread. Each request must arrive
  // within `timeout` of its connection or of the previous reply. `registry`
  // must outlive the server. IoError when the socket cannot be made.
  static Result<std::unique_ptr<MemfdServer>> Start(const MemoryRegistry& registry, Millis timeout);
  // Stops accepting, closes every connection and joins the thread.
  ~MemfdServer();
  MemfdServer(const MemfdServer&) = delete;
  MemfdServer& operator=(const MemfdServer&) = delete;

  // Where peers find it (peer_memfd.h, EncodeMemfdServer).
  const std::string& blob() const { return blob_; }

 private:
  struct State;
  MemfdServer() = default;

  std::unique_ptr<asio::io_context> io_;
  std::shared_ptr<State> state_;  // shared with the pending handlers
  std::thread thread_;
  std::string blob_;
};

}  // namespace ferry
