// `ferry node`: contributes memory to the store until SIGTERM, and with
// --socket serves the applications of its host.
#include "store/node/node.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "common/auth.h"
#include "store/node/attach_server.h"
#include "store/node/core.h"

namespace ferry::cli {

int Node(const NodeArgs& in) {
  NodeArgs args = in;
  if (!args.etcd.empty() || !args.cluster.empty()) {
    if (!args.master.empty()) {
      std::fprintf(stderr, "ferry node: give --master or --etcd/--cluster, not both\n");
      return 2;
    }
    args.master = "etcd://" + args.etcd + "/" + args.cluster;
  }
  if (args.master.empty()) {
    std::fprintf(stderr, "ferry node: --master (or --etcd and --cluster) is required\n");
    return 2;
  }
  auto engine =
      StartServingEngine("ferry node", args.host, args.port, args.transport, args.auth_key_file);
  if (!engine) return 1;
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
  // A node outlives master restarts: it keeps trying to mount.
  auto node = store::StoreNode::Start(*engine, no, /*wait_for_mount=*/false);
  if (!node.ok()) {
    std::fprintf(stderr, "ferry node: %s\n", node.status().ToString().c_str());
    return 1;
  }
  // Attached applications: their operations run here, on this node's engine.
  std::unique_ptr<store::MasterClient> client;
  std::unique_ptr<store::StoreCore> core;
  std::unique_ptr<store::AttachServer> server;
  if (!args.socket.empty()) {
    auto c = store::MasterClient::Connect(args.master, no.rpc_timeout, key.value());
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
  return 0;
}

}  // namespace ferry::cli
