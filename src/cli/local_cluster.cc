#include "cli/local_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

namespace ferry::cli {

Result<uint16_t> FreePort(const std::string& host) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return Status::InvalidArgument("not an IPv4 address: " + host);
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Status st = Status::FromErrno(errno, "bind " + host);
    close(fd);
    return st;
  }
  close(fd);
  return ntohs(a.sin_port);
}

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
  std::vector<std::string> argv = {bin, "node"};
  if (!master.empty()) argv.insert(argv.end(), {"--master", master});
  argv.insert(argv.end(), args.begin(), args.end());
  NodeProcess n;
  FERRY_ASSIGN_OR_RETURN(auto j, SpawnReady(argv, &n.proc));
  if (!j.contains("segment")) return Status::Internal("node said: " + j.dump());
  n.segment = j["segment"];
  n.master = j.value("master", master);
  return n;
}

}  // namespace ferry::cli
