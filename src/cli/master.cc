// `ferry master`: the store's metadata service until SIGTERM.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "store/master/service.h"

namespace ferry::cli {

int Master(const MasterArgs& args) {
  BlockStopSignals();
  store::MasterServerOptions o;
  o.host = args.host;
  o.port = args.port;
  o.http_port = args.http_port;
  o.master.lease = Millis(args.lease_ms);
  o.master.put_timeout = Millis(args.put_timeout_ms);
  o.master.write_grace = Millis(args.write_grace_ms);
  o.master.node_ttl = Millis(args.node_ttl_ms);
  o.master.tick = Millis(args.tick_ms);
  o.master.high_watermark = args.high_watermark;
  o.master.low_watermark = args.low_watermark;
  o.master.shards = args.shards;
  o.master.max_object_size = args.max_object_size;
  auto server = store::MasterServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "ferry master: %s\n", server.status().ToString().c_str());
    return 1;
  }
  nlohmann::json out = {{"address", server.value()->address()},
                        {"http_port", server.value()->http_port()},
                        {"pid", getpid()}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  WaitForStopSignal();
  server.value().reset();
  return 0;
}

}  // namespace ferry::cli
