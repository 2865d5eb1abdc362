// `ferry node`: contributes memory to the store until SIGTERM, and with
// --socket serves the applications of its host. Without --master it runs the
// master too, so one command serves one host; attached operations then call
// that master directly, not over gRPC.
#include "store/node/node.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "common/auth.h"
#include "store/master/service.h"
#include "store/node/attach_server.h"
#include "store/node/core.h"

namespace ferry::cli {

int Node(const NodeArgs& in) {
  NodeArgs args = in;
  if (args.master_port != 0 && (!args.master.empty() || !args.etcd.empty())) {
    std::fprintf(stderr, "ferry node: --master-port is for the master it runs without --master\n");
    return 2;
  }
  if (!args.etcd.empty() || !args.cluster.empty()) {
    if (!args.master.empty()) {
      std::fprintf(stderr, "ferry node: give --master or --etcd/--cluster, not both\n");
      return 2;
    }
    args.master = "etcd://" + args.etcd + "/" + args.cluster;
  }
  auto engine =
      StartServingEngine("ferry node", args.host, args.port, args.transport, args.auth_key_file);
  if (!engine) return 1;
  std::unique_ptr<store::MasterServer> master;  // the master run here, if any
  if (args.master.empty()) {
    store::MasterServerOptions mo;
    mo.host = args.host;
    mo.port = args.master_port;
    mo.http_port = -1;
    mo.auth_key_file = args.auth_key_file;
    auto m = store::MasterServer::Start(mo);
    if (!m.ok()) {
      std::fprintf(stderr, "ferry node: master: %s\n", m.status().ToString().c_str());
      return 1;
    }
    master = std::move(m).value();
    args.master = master->address();
  }
  // The engine has checked the file already; read once here for the rest.
  auto key = auth::LoadConfigured(args.auth_key_file);
  if (!key.ok()) {
    std::fprintf(stderr, "ferry node: %s\n", key.status().ToString().c_str());
    return 1;
  }
  store::NodeOptions no;
  no.master = args.master;
  no.segment_size = args.segment_size;
  no.segments = args.segments;
  no.heartbeat = Millis(args.heartbeat_ms);
  no.key = key.value();
  // A node outlives master restarts: it keeps trying to mount. Its own
  // master is there, so it serves only once mounted.
  auto node = store::StoreNode::Start(*engine, no, /*wait_for_mount=*/master != nullptr);
  if (!node.ok()) {
    std::fprintf(stderr, "ferry node: %s\n", node.status().ToString().c_str());
    return 1;
  }
  // Attached applications: their operations run here, on this node's engine.
  std::unique_ptr<store::MasterClient> client;
  std::unique_ptr<store::StoreCore> core;
  std::unique_ptr<store::AttachServer> server;
  if (!args.socket.empty()) {
    auto c = master ? store::MasterClient::Connect(args.master, master->InProcessService(),
                                                   no.rpc_timeout, key.value())
                    : store::MasterClient::Connect(args.master, no.rpc_timeout, key.value());
    if (!c.ok()) {
      std::fprintf(stderr, "ferry node: %s\n", c.status().ToString().c_str());
      return 1;
    }
    client = std::move(c).value();
    store::CoreOptions co;
    co.reserve_bytes = args.reserve_bytes;
    core = std::make_unique<store::StoreCore>(*engine, *client, node.value().get(), co);
    store::AttachOptions ao;
    ao.path = args.socket;
    ao.allow_uids = args.allow_uids;
    ao.master = args.master;
    ao.key = key.value();
    auto s = store::AttachServer::Start(*core, ao);
    if (!s.ok()) {
      std::fprintf(stderr, "ferry node: --socket: %s\n", s.status().ToString().c_str());
      return 1;
    }
    server = std::move(s).value();
  }
  nlohmann::json out = {{"segment", engine->name()},
                        {"master", args.master},
                        {"mounted", node.value()->mounted()},
                        {"pid", getpid()}};
  if (server) out["socket"] = server->path();
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  WaitForStopSignal();
  server.reset();
  core.reset();
  node.value().reset();
  engine.reset();
  master.reset();
  return 0;
}

}  // namespace ferry::cli
