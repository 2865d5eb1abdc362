// `ferry master`: the store's metadata service until SIGTERM. Also accepts the
// flag spellings of Mooncake's `mooncake_master` (docs/mooncake-compat.md).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "store/master/service.h"

namespace ferry::cli {

namespace {

// Mooncake flags mapped onto a Ferry option, and that option's own spelling.
struct Mapped {
  const char* name;
  const char* ferry;  // giving both spellings is refused; null: no conflict check
  const char* help;
};
constexpr Mapped kMapped[] = {
    {"rpc_port", nullptr, "= --port when not 0 (0: --port decides)"},
    {"rpc_address", "--host", "= --host"},
    {"default_kv_lease_ttl", "--lease-ms", "= --lease-ms; ms, or with ms, s, m or h"},
    {"eviction_high_watermark_ratio", "--high-watermark", "= --high-watermark"},
    {"eviction_ratio", "--low-watermark", "--low-watermark = high watermark - this (0.05)"},
    {"client_ttl", "--node-ttl-ms", "= --node-ttl-ms, in seconds"},
    {"metrics_port", "--http-port", "= --http-port"},
    {"put_start_discard_timeout_sec", "--put-timeout-ms", "= --put-timeout-ms, in seconds"},
    {"enable_ha", nullptr, "true: a candidate elected through --etcd_endpoints (--etcd)"},
    {"etcd_endpoints", "--etcd", "= --etcd, with --enable_ha; ';' or ',' between endpoints"},
    {"cluster_id", "--cluster", "= --cluster, with --enable_ha (default mooncake)"},
};
// Other HA backends than etcd.
constexpr const char* kNotYet[] = {"ha_backend_type", "ha_backend_connstring"};
// Accepted and reported: nothing in Ferry corresponds to them.
constexpr const char* kIgnored[] = {
    "rpc_thread_num",
    "max_threads",
    "rpc_interface",
    "rpc_conn_timeout_seconds",
    "rpc_enable_tcp_no_delay",
    "metrics_host",
    "enable_metric_reporting",
    "default_kv_soft_pin_ttl",
    "max_kv_soft_pin_ttl",
    "allow_evict_soft_pinned_objects",
    "enable_http_metadata_server",
    "http_metadata_server_port",
    "http_metadata_server_host",
    "enable_offload",
    "offload_on_evict",
    "root_fs_dir",
    "global_file_segment_size",
    "memory_allocator",
    "allocation_strategy",
    "config_path",
    "put_start_release_timeout_sec",
};

Status Bad(const std::string& flag, const std::string& value, const std::string& why) {
  return Status::InvalidArgument("--" + flag + " '" + value + "': " + why);
}

// A whole-string integer in [lo, hi].
Result<int64_t> Integer(const std::string& flag, const std::string& value, int64_t lo, int64_t hi) {
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(value, &pos);
  } catch (const std::exception&) {
    return Bad(flag, value, "not an integer");
  }
  if (pos != value.size()) return Bad(flag, value, "not an integer");
  if (v < lo || v > hi) {
    return Bad(flag, value,
               "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

Result<double> Ratio(const std::string& flag, const std::string& value) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(value, &pos);
  } catch (const std::exception&) {
    return Bad(flag, value, "not a number");
  }
  if (pos != value.size()) return Bad(flag, value, "not a number");
  if (!(v >= 0.0 && v <= 1.0)) return Bad(flag, value, "must be between 0 and 1");
  return v;
}

// gflags' spellings of a boolean; a bare flag is true.
Result<bool> Boolean(const std::string& flag, const std::string& value) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v.empty() || v == "true" || v == "t" || v == "yes" || v == "y" || v == "1") return true;
  if (v == "false" || v == "f" || v == "no" || v == "n" || v == "0") return false;
  return Bad(flag, value, "not a boolean (true or false)");
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

const std::vector<MooncakeFlag>& MooncakeMasterFlags() {
  static const std::vector<MooncakeFlag> flags = [] {
    std::vector<MooncakeFlag> v;
    for (const auto& m : kMapped) v.push_back({m.name, m.help});
    for (const char* n : kNotYet) v.push_back({n, ""});
    for (const char* n : kIgnored) v.push_back({n, ""});
    return v;
  }();
  return flags;
}

Result<int64_t> ParseDurationMs(const std::string& text) {
  const std::string t = Trim(text);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits == 0) {
    return Status::InvalidArgument("bad duration '" + text +
                                   "': a number of milliseconds, or with ms, s, m or h");
  }
  std::string unit = Trim(t.substr(digits));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  int64_t mul = 0;
  if (unit.empty() || unit == "ms")
    mul = 1;
  else if (unit == "s")
    mul = 1000;
  else if (unit == "m")
    mul = 60 * 1000;
  else if (unit == "h")
    mul = 60 * 60 * 1000;
  else
    return Status::InvalidArgument("bad duration unit in '" + text + "': use ms, s, m or h");
  const std::string number = t.substr(0, digits);
  if (number.size() > 15) return Status::InvalidArgument("duration '" + text + "' is too large");
  return std::stoll(number) * mul;
}

Status ApplyMooncakeMasterFlags(const std::vector<std::pair<std::string, std::string>>& given,
                                const std::vector<std::string>& ferry_given, MasterArgs* a) {
  auto has_ferry = [&](const char* spelling) {
    return std::find(ferry_given.begin(), ferry_given.end(), spelling) != ferry_given.end();
  };
  std::vector<std::string> ignored, not_yet;
  const std::string* ratio = nullptr;
  bool high_given = false;
  bool ha = false;
  std::string etcd, cluster;
  for (const auto& [name, value] : given) {
    for (const auto& m : kMapped) {
      if (name == m.name && m.ferry != nullptr && has_ferry(m.ferry)) {
        return Status::InvalidArgument(std::string("give --") + m.name + " or " + m.ferry +
                                       ", not both");
      }
    }
    if (name == "rpc_port") {
      auto v = Integer(name, value, 0, 65535);
      if (!v.ok()) return v.status();
      if (v.value() != 0) a->port = static_cast<uint16_t>(v.value());
    } else if (name == "rpc_address") {
      if (value.empty()) return Bad(name, value, "an address is required");
      a->host = value;
    } else if (name == "default_kv_lease_ttl") {
      auto v = ParseDurationMs(value);
      if (!v.ok()) return Status::InvalidArgument("--" + name + ": " + v.status().message());
      if (v.value() < 1 || v.value() > 86400000) return Bad(name, value, "must be 1 ms to 24 h");
      a->lease_ms = v.value();
    } else if (name == "eviction_high_watermark_ratio") {
      auto v = Ratio(name, value);
      if (!v.ok()) return v.status();
      a->high_watermark = v.value();
      high_given = true;
    } else if (name == "eviction_ratio") {
      auto v = Ratio(name, value);
      if (!v.ok()) return v.status();
      ratio = &value;
    } else if (name == "client_ttl") {
      auto v = Integer(name, value, 1, 86400);
      if (!v.ok()) return v.status();
      a->node_ttl_ms = v.value() * 1000;
    } else if (name == "metrics_port") {
      auto v = Integer(name, value, -1, 65535);
      if (!v.ok()) return v.status();
      a->http_port = static_cast<int>(v.value());
    } else if (name == "put_start_discard_timeout_sec") {
      auto v = Integer(name, value, 1, 86400);
      if (!v.ok()) return v.status();
      a->put_timeout_ms = v.value() * 1000;
    } else if (name == "enable_ha") {
      auto v = Boolean(name, value);
      if (!v.ok()) return v.status();
      ha = v.value();
    } else if (name == "etcd_endpoints") {
      etcd = value;
      std::replace(etcd.begin(), etcd.end(), ';', ',');
    } else if (name == "cluster_id") {
      if (value.empty()) return Bad(name, value, "a cluster name is required");
      cluster = value;
    } else if (std::find(std::begin(kNotYet), std::end(kNotYet), name) != std::end(kNotYet)) {
      not_yet.push_back("--" + name);
    } else {
      ignored.push_back("--" + name);
    }
  }
  if (ha) {
    if (etcd.empty()) {
      return Status::InvalidArgument(
          "--enable_ha needs --etcd_endpoints (masters elect through etcd)");
    }
    a->etcd = etcd;
    a->cluster = cluster.empty() ? "mooncake" : cluster;
  } else if (!etcd.empty() || !cluster.empty()) {
    a->notices.push_back(
        "ferry master: --etcd_endpoints and --cluster_id mean nothing without --enable_ha; "
        "ignored");
  }
  // Mooncake evicts down to about high - ratio once use passes the high
  // watermark: Ferry's low watermark. Its default ratio is 0.05.
  if (ratio != nullptr || (high_given && !has_ferry("--low-watermark"))) {
    const double r = ratio != nullptr ? std::stod(*ratio) : 0.05;
    a->low_watermark = std::max(0.0, a->high_watermark - r);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!not_yet.empty()) {
    a->notices.push_back("ferry master: " + join(not_yet) +
                         ": not supported yet (etcd is the only HA backend); ignored");
  }
  if (!ignored.empty()) {
    a->notices.push_back("ferry master: accepted, but no meaning in Ferry: " + join(ignored));
  }
  return Status::Ok();
}

int Master(const MasterArgs& args) {
  for (const auto& line : args.notices) std::fprintf(stderr, "%s\n", line.c_str());
  BlockStopSignals();
  store::MasterServerOptions o;
  o.host = args.host;
  o.port = args.port;
  o.http_port = args.http_port;
  o.socket_port = args.socket_port;
  o.master.lease = Millis(args.lease_ms);
  o.master.put_timeout = Millis(args.put_timeout_ms);
  o.master.write_grace = Millis(args.write_grace_ms);
  o.master.node_ttl = Millis(args.node_ttl_ms);
  o.master.tick = Millis(args.tick_ms);
  o.master.high_watermark = args.high_watermark;
  o.master.low_watermark = args.low_watermark;
  o.master.shards = args.shards;
  o.master.max_object_size = args.max_object_size;
  // Without elections, the clock orders a master's terms across restarts:
  // objects rebuilt from the nodes then come from an older term.
  o.master.term =
      args.term >= 0
          ? static_cast<uint64_t>(args.term)
          : static_cast<uint64_t>(std::chrono::duration_cast<Millis>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count());
  o.auth_key_file = args.auth_key_file;
  const bool elected = !args.etcd.empty() || !args.cluster.empty();
  o.master.catalog_sync =
      Millis(args.catalog_sync_ms >= 0 ? args.catalog_sync_ms : (elected ? 1000 : 0));
  if (elected) {
    if (args.term >= 0) {
      std::fprintf(stderr, "ferry master: give --term or --etcd, not both: the election sets it\n");
      return 2;
    }
    return MasterWithElection(args, o);
  }
  auto server = store::MasterServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "ferry master: %s\n", server.status().ToString().c_str());
    return 1;
  }
  nlohmann::json out = {{"address", server.value()->address()},
                        {"http_port", server.value()->http_port()},
                        {"socket_port", server.value()->socket_port()},
                        {"term", o.master.term},
                        {"pid", getpid()}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  WaitForStopSignal();
  server.value().reset();
  return 0;
}

}  // namespace ferry::cli
