// Helpers of the attach tests (attach_test.cc, attach_peer_test.cc): a
// master and a node serving a socket as processes, an attach server in this
// process, and raw connections that speak the protocol badly.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/auth.h"
#include "common/bytes.h"
#include "integration/key_file.h"
#include "store/node/attach_server.h"
#include "store/node/core.h"
#include "store/rpc/attach_wire.h"
#include "store/store_cluster.h"

namespace ferry::test {

namespace attach = store::attach;

inline std::string SocketPath(const char* name) {
  return "/tmp/ferry-test-" + std::to_string(getpid()) + "-" + name + ".sock";
}

// A master and one node that serves `path`.
struct AttachCluster {
  cli::MasterProcess master;
  cli::NodeProcess node;
  std::string path;
};

inline Result<cli::NodeProcess> StartSocketNode(const std::string& master,
                                                const std::string& path) {
  return cli::SpawnNode(FerryBin(), master,
                        {"--segment-size", "64MiB", "--heartbeat-ms", "50", "--socket", path});
}

inline Result<AttachCluster> StartAttachCluster(const char* name) {
  AttachCluster c;
  c.path = SocketPath(name);
  FERRY_ASSIGN_OR_RETURN(c.master, cli::SpawnMaster(FerryBin(), {"--tick-ms", "20"}));
  FERRY_ASSIGN_OR_RETURN(c.node, StartSocketNode(c.master.address, c.path));
  return c;
}

inline StoreOptions Small(uint64_t staging = 8 << 20) {
  StoreOptions o;
  o.attach_staging = staging;
  o.rpc_timeout = Millis(5000);
  return o;
}

// A raw connection to the socket, for speaking the protocol badly.
inline int RawConnect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline Result<attach::Frame> RawCall(int fd, attach::Type type, const std::vector<uint8_t>& payload,
                                     int pass_fd = -1, StatusCode code = StatusCode::kOk) {
  FERRY_RETURN_IF_ERROR(
      attach::Send(fd, type, 7, 1000, code, payload, Deadline::After(Millis(2000)), pass_fd));
  return attach::Receive(fd, Deadline::After(Millis(5000)), Millis(5000));
}

// A raw client past its Hello.
inline int RawAttached(const std::string& path) {
  int fd = RawConnect(path);
  if (fd < 0) return -1;
  std::vector<uint8_t> hello;
  ByteWriter(&hello).U32(1);
  auto r = RawCall(fd, attach::Type::kHello, hello);
  if (!r.ok() || r.value().code != StatusCode::kOk) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the node has closed `fd`: a read sees EOF within the timeout.
inline bool ClosedByPeer(int fd) {
  auto f = attach::Receive(fd, Deadline::After(Millis(5000)), Millis(5000));
  return !f.ok() && f.status().code() == StatusCode::kConnectionLost;
}

// An attach server in this process, for options that `ferry node` keeps to
// itself: an engine and a core over `master`, serving `o.path`.
struct AttachServerHere {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<store::MasterClient> client;
  std::unique_ptr<store::StoreCore> core;
  std::unique_ptr<store::AttachServer> server;
};

// With `key_file`, the engine, the master calls and the socket hold that secret.
inline Result<AttachServerHere> ServeHere(const std::string& master, store::AttachOptions o,
                                          const std::string& key_file = "") {
  AttachServerHere h;
  EngineOptions eo;
  eo.auth_key_file = key_file;
  FERRY_ASSIGN_OR_RETURN(h.engine, Engine::Create(eo));
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const auth::Key> key, auth::LoadConfigured(key_file));
  FERRY_ASSIGN_OR_RETURN(h.client, store::MasterClient::Connect(master, Millis(5000), key));
  h.core = std::make_unique<store::StoreCore>(*h.engine, *h.client, nullptr, store::CoreOptions{});
  o.master = master;
  o.key = key;
  FERRY_ASSIGN_OR_RETURN(h.server, store::AttachServer::Start(*h.core, std::move(o)));
  return h;
}

// A raw connection made as `uid`, on a thread of its own: the raw syscall
// changes that thread's effective uid alone (glibc's seteuid would change
// every thread's, the server's too). -1 when it cannot be made.
inline int RawConnectAs(uint32_t uid, const std::string& path) {
  int fd = -1;
  std::thread([&] {
    if (syscall(SYS_setresuid, -1, uid, -1) == 0) fd = RawConnect(path);
  }).join();
  return fd;
}

// Whether the node admits the client on `fd`: its Hello is answered OK.
inline bool SaysHello(int fd) {
  std::vector<uint8_t> hello;
  ByteWriter(&hello).U32(1);
  auto r = RawCall(fd, attach::Type::kHello, hello);
  return r.ok() && r.value().code == StatusCode::kOk;
}

// A real client attaches and gets an answer from the master through the node.
inline Status AttachAndAsk(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(auto s, Store::Attach(path, Small()));
  return s->Stats().status();
}

}  // namespace ferry::test
