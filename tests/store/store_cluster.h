// A master and nodes in their own processes on loopback, started from the
// `ferry` binary built beside the tests (FERRY_BIN, or $FERRY_BIN).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <string>
#include <thread>
#include <vector>

#include "cli/local_cluster.h"
#include "common/clock.h"
#include "ferry/store.h"
#include "integration/peer.h"

namespace ferry::test {

struct Cluster {
  cli::MasterProcess master;
  std::vector<cli::NodeProcess> nodes;
};

// Short timeouts keep the tests quick; each test may add master flags.
inline Result<Cluster> StartCluster(int nodes, const std::string& node_size,
                                    std::vector<std::string> master_args = {},
                                    int heartbeat_ms = 50) {
  Cluster c;
  master_args.insert(master_args.end(), {"--tick-ms", "20"});
  FERRY_ASSIGN_OR_RETURN(c.master, cli::SpawnMaster(FerryBin(), master_args));
  for (int i = 0; i < nodes; ++i) {
    FERRY_ASSIGN_OR_RETURN(auto n, cli::SpawnNode(FerryBin(), c.master.address,
                                                  {"--segment-size", node_size, "--heartbeat-ms",
                                                   std::to_string(heartbeat_ms)}));
    c.nodes.push_back(std::move(n));
  }
  return c;
}

// A pure client (no memory of its own) of `master`.
inline Result<std::unique_ptr<Store>> Client(const std::string& master,
                                             StoreOptions o = StoreOptions()) {
  o.master = master;
  o.local_memory = 0;
  return Store::Create(o);
}

template <typename F>
bool Eventually(F&& cond, Millis limit = Millis(15000)) {
  Deadline d = Deadline::After(limit);
  while (!cond()) {
    if (d.Expired()) return false;
    std::this_thread::sleep_for(Millis(20));
  }
  return true;
}

// Reads a counter from the master's /metrics; -1 when unreadable.
inline int64_t Metric(int http_port, const std::string& name) {
  httplib::Client http("127.0.0.1", http_port);
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  auto r = http.Get("/metrics");
  if (!r) return -1;
  const std::string needle = "\n" + name + " ";
  size_t at = r->body.find(needle);
  if (at == std::string::npos) return -1;
  return std::stoll(r->body.substr(at + needle.size()));
}

inline std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  FillRandom(v.data(), n, seed);
  return v;
}

}  // namespace ferry::test
