#include "integration/etcd_server.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "coord/etcd_client.h"
#include "integration/peer.h"

namespace ferry::test {
namespace {

// A free loopback port; held only until etcd takes it.
uint16_t FreePort() {
  uint16_t port = 0;
  int fd = ListenOnLoopback(&port);
  if (fd < 0) return 0;
  close(fd);
  return port;
}

}  // namespace

std::string EtcdBinary() {
  const char* env = std::getenv("FERRY_ETCD");
  if (env != nullptr && *env != '\0') return access(env, X_OK) == 0 ? env : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? colon : colon - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/etcd";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

Result<std::unique_ptr<EtcdServer>> EtcdServer::Start() {
  if (EtcdBinary().empty()) return Status::NotFound("no etcd binary (FERRY_ETCD or PATH)");
  std::unique_ptr<EtcdServer> s(new EtcdServer());
  char tmpl[] = "/tmp/ferry-etcd-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::FromErrno(errno, "mkdtemp");
  s->dir_ = tmpl;
  s->client_port_ = FreePort();
  s->peer_port_ = FreePort();
  if (s->client_port_ == 0 || s->peer_port_ == 0) return Status::IoError("no free port");
  s->endpoint_ = "127.0.0.1:" + std::to_string(s->client_port_);
  FERRY_RETURN_IF_ERROR(s->Launch());
  return s;
}

Status EtcdServer::Launch() {
  const std::string client = "http://" + endpoint_;
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  proc_.reset();
  FERRY_ASSIGN_OR_RETURN(
      proc_, Subprocess::Spawn({EtcdBinary(), "--name", "ferry-test", "--data-dir", dir_ + "/data",
                                "--listen-client-urls", client, "--advertise-client-urls", client,
                                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                "--initial-cluster", "ferry-test=" + peer, "--logger", "zap",
                                "--log-level", "error"},
                               true));
  coord::EtcdOptions o;
  o.endpoints = {endpoint_};
  o.call_timeout = Millis(500);
  FERRY_ASSIGN_OR_RETURN(auto client_rpc, coord::EtcdClient::Create(o));
  const Deadline deadline = Deadline::After(std::chrono::seconds(30));
  Status last = Status::Timeout("etcd at " + endpoint_ + " did not answer within 30 s");
  while (!deadline.Expired()) {
    if (proc_->Wait(Millis(0)).ok()) return Status::Unavailable("etcd exited at start");
    auto r = client_rpc->Get("/ferry-test-probe");
    if (r.ok()) return Status::Ok();
    last = Status(r.status().code(), "etcd at " + endpoint_ + ": " + r.status().message());
    std::this_thread::sleep_for(Millis(50));
  }
  return last;
}

EtcdServer::~EtcdServer() {
  if (proc_) (void)Kill();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string EtcdServer::Url(const std::string& cluster) const {
  return "etcd://" + endpoint_ + "/" + cluster;
}

Status EtcdServer::Kill() {
  if (!proc_) return Status::Ok();
  (void)proc_->Signal(SIGKILL);
  auto r = proc_->Wait(std::chrono::seconds(10));
  proc_.reset();
  return r.status();
}

Status EtcdServer::Restart() {
  FERRY_RETURN_IF_ERROR(Kill());
  return Launch();
}

}  // namespace ferry::test
