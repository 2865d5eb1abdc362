#include "cli/local_cluster.h"

#include <nlohmann/json.hpp>

namespace ferry::cli {

Result<nlohmann::json> SpawnReady(const std::vector<std::string>& argv,
                                  std::unique_ptr<Subprocess>* proc) {
  FERRY_ASSIGN_OR_RETURN(*proc, Subprocess::Spawn(argv, true));
  Deadline deadline = Deadline::After(std::chrono::seconds(20));
  for (;;) {
    auto left = std::chrono::duration_cast<Millis>(deadline.Remaining());
    FERRY_ASSIGN_OR_RETURN(std::string line, (*proc)->ReadLine(left));
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::Internal(argv[1] + " said: " + line);
    }
    return j;
  }
}

Result<MasterProcess> SpawnMaster(const std::string& bin, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {bin, "master"};
  argv.insert(argv.end(), args.begin(), args.end());
  MasterProcess m;
  FERRY_ASSIGN_OR_RETURN(auto j, SpawnReady(argv, &m.proc));
  if (!j.contains("address")) return Status::Internal("master said: " + j.dump());
  m.address = j["address"];
  m.http_port = j.value("http_port", -1);
  return m;
}

Result<NodeProcess> SpawnNode(const std::string& bin, const std::string& master,
                              const std::vector<std::string>& args) {
  std::vector<std::string> argv = {bin, "node", "--master", master};
  argv.insert(argv.end(), args.begin(), args.end());
  NodeProcess n;
  FERRY_ASSIGN_OR_RETURN(auto j, SpawnReady(argv, &n.proc));
  if (!j.contains("segment")) return Status::Internal("node said: " + j.dump());
  n.segment = j["segment"];
  return n;
}

}  // namespace ferry::cli
