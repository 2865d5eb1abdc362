// The master as a network service: the gRPC control plane
// (src/proto/store.proto), the same calls of the data path over a plain TCP
// socket (store/rpc/master_wire.h), and an HTTP endpoint with Prometheus text
// on /metrics and "ok" on /health. Every request is validated here before it
// reaches the Master.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ferry/status.h"
#include "store/master/master.h"
#include "store/rpc/limits.h"

namespace grpc {
class Service;
}

namespace ferry::store {

struct MasterServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // gRPC; 0 picks a free port
  // The socket calls (store/rpc/master_wire.h), on the same host: 0 picks a
  // free port, -1 serves none (every call then goes by gRPC). Clients learn
  // it from the Hello call.
  int socket_port = 0;
  size_t socket_max_connections = 1024;
  int http_port = 0;  // 0 picks a free port, -1 serves no HTTP
  // master.gate is asked before every call: one refused gets UNAVAILABLE
  // with its message (a master whose leadership is not confirmed).
  MasterOptions master;
  // The cluster secret's file: every gRPC call must carry a token made with
  // it (store/rpc/call_auth.h), or is refused with UNAUTHENTICATED. Empty:
  // env FERRY_AUTH_KEY_FILE; neither: no authentication. HTTP (/metrics,
  // /health: counts, no data) is never authenticated.
  std::string auth_key_file;
  // Lines appended to /health and to /metrics (Prometheus text), read per
  // request: what the process knows beyond this master, such as its role in
  // an election. Empty: none.
  std::function<std::string()> extra_health, extra_metrics;
};

class MasterServer {
 public:
  // Most items one request may carry.
  static constexpr int kMaxBatch = store::kMaxBatch;

  // Binds and starts serving. Unavailable when a port cannot be bound;
  // InvalidArgument for a key file that is missing, empty, too short or
  // readable by group or others.
  static Result<std::unique_ptr<MasterServer>> Start(const MasterServerOptions& options);
  // Stops serving; in-flight calls get up to a second to finish.
  ~MasterServer();

  const std::string& address() const;  // "host:port" of the gRPC service
  int http_port() const;               // -1 when not serving HTTP
  // Calls refused for the cluster secret since Start, by gRPC or socket.
  // Never blocks.
  uint64_t auth_failures() const;
  int socket_port() const;            // 0 when serving no socket calls
  uint64_t socket_calls() const;      // socket requests answered since Start
  size_t socket_connections() const;  // socket connections served now
  // The service for callers in this process (MasterClient::Connect with a
  // service): the same validation and gate, without the cluster-secret check,
  // since such a caller could reach the Master itself.
  grpc::Service* InProcessService() const;

  class Impl;

 private:
  explicit MasterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prometheus exposition text of `stats`.
std::string MetricsText(const MasterStats& stats);

}  // namespace ferry::store
