// `ferry master --etcd ENDPOINTS --cluster NAME`: a candidate for the
// cluster's leadership (store/rpc/leader.h). While standby it serves only
// HTTP: /health says "standby" and who leads, /metrics says it leads not.
// Once elected it runs the master itself, in the term the election gave,
// on the address it published, until deposed; then standby again, with no
// metadata: a later leadership rebuilds it from the nodes' catalogs.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <thread>

#include "cli/cli.h"
#include "cli/local_cluster.h"
#include "common/log.h"
#include "coord/etcd_client.h"
#include "coord/etcd_url.h"
#include "store/master/service.h"
#include "store/rpc/leader.h"

namespace ferry::cli {
namespace {

// What the process is in the election, for /health and /metrics, and the
// master while it leads. Callbacks of the election and HTTP handlers share it.
class Candidate {
 public:
  Candidate(store::MasterServerOptions o, std::shared_ptr<coord::EtcdClient> etcd,
            std::string cluster)
      : o_(std::move(o)), etcd_(std::move(etcd)), cluster_(std::move(cluster)) {
    o_.extra_health = [this] { return Health(); };
    o_.extra_metrics = [this] { return Metrics(); };
    // Under the lock: main may be destroying the election, and the master's
    // own thread asks too, every tick.
    o_.master.gate = [this] {
      std::shared_lock lk(election_mu_);
      return election_ != nullptr ? election_->Confirmed()
                                  : Status::Unavailable("this master is starting or stopping");
    };
  }
  // Set once the election runs, cleared before it is destroyed; the gate
  // asks it before each call and at each of the master's ticks.
  void set_election(store::LeaderElection* e) {
    std::unique_lock lk(election_mu_);
    election_ = e;
  }
  ~Candidate() { StopStandby(); }

  Status StartStandby() {
    if (o_.http_port < 0) return Status::Ok();
    standby_ = std::make_unique<httplib::Server>();
    standby_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content("standby\n" + Health(), "text/plain");
    });
    standby_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(Metrics(), "text/plain; version=0.0.4");
    });
    // The leader's server bound this port a moment ago: let it go first.
    for (int i = 0; i < 50 && !standby_->bind_to_port(o_.host, o_.http_port); ++i) {
      std::this_thread::sleep_for(Millis(20));
    }
    if (!standby_->is_valid()) return Status::Unavailable("cannot serve HTTP");
    standby_thread_ = std::thread([s = standby_.get()] { s->listen_after_bind(); });
    return Status::Ok();
  }

  void StopStandby() {
    if (standby_ == nullptr) return;
    standby_->stop();
    if (standby_thread_.joinable()) standby_thread_.join();
    standby_.reset();
  }

  void Elected(uint64_t term, Millis vacancy) {
    const Clock::time_point t0 = Clock::now();
    StopStandby();
    store::MasterServerOptions o = o_;
    o.master.term = term;
    // The nodes on the roster will mount again: misses wait for them.
    if (auto roster = store::ReadRoster(*etcd_, cluster_); roster.ok()) {
      o.master.awaited_nodes = std::move(roster).value();
    } else {
      FERRY_LOG_WARN("master: no roster ({}); a miss is trusted before the nodes mount",
                     roster.status().ToString());
    }
    // The port was ours a term ago; a server of that term may still hold it.
    Result<std::unique_ptr<store::MasterServer>> s = Status::Unavailable("not started");
    for (int i = 0; i < 50; ++i) {
      s = store::MasterServer::Start(o);
      if (s.ok()) break;
      std::this_thread::sleep_for(Millis(20));
    }
    if (!s.ok()) {
      FERRY_LOG_ERROR("master: elected in term {} but cannot serve: {}", term,
                      s.status().ToString());
      kill(getpid(), SIGTERM);  // main resigns, so another candidate can lead
      return;
    }
    std::lock_guard lk(mu_);
    server_ = std::move(s).value();
    term_ = term;
    ++elections_;
    failover_ = vacancy + std::chrono::duration_cast<Millis>(Clock::now() - t0);
    FERRY_LOG_WARN(
        "master: leading in term {}; serving {} ms after the seat was seen empty; awaiting {} "
        "nodes on the roster",
        term, failover_.count(), o.master.awaited_nodes.size());
  }

  void Deposed() {
    DropServer();  // its metadata goes: the next leadership rebuilds it from the nodes
    Status st = StartStandby();
    if (!st.ok()) FERRY_LOG_WARN("master: standby HTTP: {}", st.ToString());
  }

  void Stop() {
    DropServer();
    StopStandby();
  }

 private:
  void DropServer() {
    std::unique_ptr<store::MasterServer> old;
    {
      std::lock_guard lk(mu_);
      term_ = 0;
      old = std::move(server_);
    }
    old.reset();  // outside the lock: it waits for calls that read Health()
  }

  std::string Health() {
    auto kv = etcd_->Get(store::LeaderKey(cluster_));
    std::string leader =
        !kv.ok()     ? "unknown (etcd: " + kv.status().ToString() + ")"
        : kv.value() ? kv.value()->value + " term " + std::to_string(kv.value()->create_revision)
                     : "none";
    std::lock_guard lk(mu_);
    return "cluster " + cluster_ + "\nleader " + leader + "\nleading " +
           (term_ != 0 ? "yes" : "no") + "\nlast_failover_ms " + std::to_string(failover_.count()) +
           "\n";
  }

  std::string Metrics() {
    std::lock_guard lk(mu_);
    std::string out;
    auto add = [&](const char* name, const char* type, const char* help, uint64_t v) {
      out += "# HELP ferry_" + std::string(name) + " " + help + "\n# TYPE ferry_" + name + " " +
             type + "\nferry_" + name + " " + std::to_string(v) + "\n";
    };
    add("master_leader", "gauge", "1 while this master leads its cluster.", term_ != 0);
    add("master_term", "gauge", "The term this master leads in; 0 while standby.", term_);
    add("master_elections_total", "counter", "Times this master was elected.", elections_);
    add("master_last_failover_ms", "gauge",
        "From the last round that saw another leader to serving, at the last election.",
        static_cast<uint64_t>(failover_.count()));
    return out;
  }

  store::MasterServerOptions o_;
  const std::shared_ptr<coord::EtcdClient> etcd_;
  const std::string cluster_;
  std::shared_mutex election_mu_;
  store::LeaderElection* election_ = nullptr;  // guarded by election_mu_
  std::unique_ptr<httplib::Server> standby_;   // the election thread's, and main's
  std::thread standby_thread_;
  std::mutex mu_;
  std::unique_ptr<store::MasterServer> server_;  // guarded by mu_
  uint64_t term_ = 0;                            // guarded by mu_
  uint64_t elections_ = 0;                       // guarded by mu_
  Millis failover_{0};                           // guarded by mu_
};

}  // namespace

int MasterWithElection(const MasterArgs& args, const store::MasterServerOptions& options) {
  store::MasterServerOptions o = options;
  auto url = coord::ParseEtcdUrl(std::string(coord::kEtcdScheme) + args.etcd + "/" + args.cluster);
  if (!url.ok()) {
    std::fprintf(stderr, "ferry master: --etcd/--cluster: %s\n", url.status().ToString().c_str());
    return 2;
  }
  auto etcd = coord::EtcdClient::Create({url.value().endpoints, Millis(args.etcd_timeout_ms)});
  if (!etcd.ok()) {
    std::fprintf(stderr, "ferry master: %s\n", etcd.status().ToString().c_str());
    return 2;
  }
  if (auto probe = etcd.value()->Get(store::LeaderKey(url.value().cluster)); !probe.ok()) {
    std::fprintf(stderr, "ferry master: etcd %s: %s\n", args.etcd.c_str(),
                 probe.status().ToString().c_str());
    return 1;
  }
  // Fixed now, so that the address a candidate publishes is the one it serves.
  auto pick = [&](auto* port) {
    if (*port != 0) return true;
    auto free = FreePort(o.host);
    if (!free.ok()) {
      std::fprintf(stderr, "ferry master: no free port: %s\n", free.status().ToString().c_str());
      return false;
    }
    *port = free.value();
    return true;
  };
  if (!pick(&o.port) || !pick(&o.http_port) || !pick(&o.socket_port)) return 1;
  const std::string address = o.host + ":" + std::to_string(o.port);
  Candidate candidate(o, etcd.value(), url.value().cluster);
  if (Status st = candidate.StartStandby(); !st.ok()) {
    std::fprintf(stderr, "ferry master: HTTP port %d: %s\n", o.http_port, st.ToString().c_str());
    return 1;
  }
  store::LeaderElection::Options eo;
  eo.address = address;
  eo.ttl_seconds = args.leader_ttl_s;
  auto election = store::LeaderElection::Start(
      etcd.value(), url.value().cluster, eo,
      [&candidate](uint64_t term, Millis vacancy) { candidate.Elected(term, vacancy); },
      [&candidate](const Status&) { candidate.Deposed(); });
  if (!election.ok()) {
    std::fprintf(stderr, "ferry master: %s\n", election.status().ToString().c_str());
    return 2;
  }
  candidate.set_election(election.value().get());
  nlohmann::json out = {{"address", address},
                        {"http_port", o.http_port},
                        {"cluster", url.value().cluster},
                        {"pid", getpid()}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  WaitForStopSignal();
  candidate.set_election(nullptr);
  election.value().reset();  // resigns: a standby takes over at once
  candidate.Stop();
  return 0;
}

}  // namespace ferry::cli
