// `ferry node`: contributes memory to the store until SIGTERM.
#include "store/node/node.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace ferry::cli {

int Node(const NodeArgs& args) {
  auto engine = StartServingEngine("ferry node", args.host, args.port, args.transport);
  if (!engine) return 1;
  store::NodeOptions no;
  no.master = args.master;
  no.segment_size = args.segment_size;
  no.segments = args.segments;
  no.heartbeat = Millis(args.heartbeat_ms);
  // A node outlives master restarts: it keeps trying to mount.
  auto node = store::StoreNode::Start(*engine, no, /*wait_for_mount=*/false);
  if (!node.ok()) {
    std::fprintf(stderr, "ferry node: %s\n", node.status().ToString().c_str());
    return 1;
  }
  nlohmann::json out = {{"segment", engine->name()},
                        {"master", args.master},
                        {"mounted", node.value()->mounted()},
                        {"pid", getpid()}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  WaitForStopSignal();
  node.value().reset();
  engine.reset();
  return 0;
}

}  // namespace ferry::cli
