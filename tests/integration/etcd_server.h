// A real etcd for tests: its own process on loopback ports the test picks,
// its own data directory, killed and removed at the end. Shared by the etcd
// client, engine metadata and master tests.
#pragma once

#include <memory>
#include <string>

#include "common/subprocess.h"
#include "ferry/status.h"

namespace ferry::test {

// The etcd binary: FERRY_ETCD from the environment, else `etcd` on PATH;
// empty when there is none (scripts/install-deps installs etcd-server).
std::string EtcdBinary();

class EtcdServer {
 public:
  // Starts etcd and waits until it answers a read, up to 30 s. NotFound
  // when there is no etcd binary; the start's error otherwise.
  static Result<std::unique_ptr<EtcdServer>> Start();
  // Kills it and removes its data directory.
  ~EtcdServer();
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // "127.0.0.1:PORT", its client endpoint.
  const std::string& endpoint() const { return endpoint_; }
  // "etcd://127.0.0.1:PORT/<cluster>".
  std::string Url(const std::string& cluster) const;
  // SIGKILLs it and reaps it; its data stays for Restart.
  Status Kill();
  // Starts it again on the same ports and data, and waits as Start does.
  Status Restart();

 private:
  EtcdServer() = default;
  Status Launch();

  std::string dir_;
  std::string endpoint_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  std::unique_ptr<Subprocess> proc_;
};

}  // namespace ferry::test

// Skips the test, saying why, when etcd is not installed.
#define FERRY_SKIP_WITHOUT_ETCD()                                                          \
  do {                                                                                     \
    if (::ferry::test::EtcdBinary().empty()) {                                             \
      GTEST_SKIP() << "etcd is not installed (Debian: etcd-server; scripts/install-deps)"; \
    }                                                                                      \
  } while (0)
