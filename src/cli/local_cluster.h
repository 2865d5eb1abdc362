// `ferry master` and `ferry node` processes on loopback, for the demo, the
// store benchmark and the store tests. Each prints one JSON line when ready.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace ferry::cli {

struct MasterProcess {
  std::unique_ptr<Subprocess> proc;
  std::string address;  // gRPC, host:port
  int http_port = -1;
};

struct NodeProcess {
  std::unique_ptr<Subprocess> proc;
  std::string segment;  // the node's engine name
  std::string master;   // the master it mounted on
};

// Spawns `argv` into *proc and waits up to 20 s for its JSON line on stdout.
// Other lines (log lines also go to stdout) are skipped.
Result<nlohmann::json> SpawnReady(const std::vector<std::string>& argv,
                                  std::unique_ptr<Subprocess>* proc);
// A TCP port free on `host` (an IPv4 address) now, for a process to be told
// before it serves: the bind is released at once, so another may take it.
Result<uint16_t> FreePort(const std::string& host = "127.0.0.1");
// Starts `bin master` with `args`; waits up to 20 s for its JSON line.
Result<MasterProcess> SpawnMaster(const std::string& bin, const std::vector<std::string>& args);
// Starts `bin node --master <master>` with `args` (empty `master`: the node
// runs its own); waits up to 20 s.
Result<NodeProcess> SpawnNode(const std::string& bin, const std::string& master,
                              const std::vector<std::string>& args);

}  // namespace ferry::cli
