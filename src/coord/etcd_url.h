// Where a cluster's etcd is: "etcd://host:port[,host:port...]/CLUSTER", the
// form EngineOptions::metadata and (later) the store's master take.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::coord {

inline constexpr std::string_view kEtcdScheme = "etcd://";

struct EtcdUrl {
  std::vector<std::string> endpoints;  // "host:port", in the order given
  std::string cluster;                 // names the cluster's keys: /ferry/<cluster>/...
};

// Whether `s` starts with etcd:// (so a caller can tell a typo from p2p).
bool IsEtcdUrl(std::string_view s);

// Parses "etcd://ENDPOINTS/CLUSTER". InvalidArgument, saying what is wrong,
// for another scheme, no endpoint, an endpoint that is not host:port with a
// port in 1..65535, an empty or over-long cluster name, or one with other
// characters than letters, digits, '-', '_' and '.'.
Result<EtcdUrl> ParseEtcdUrl(std::string_view url);

// Parses "host:port[,host:port...]" (no scheme), as ParseEtcdUrl does its
// endpoints. InvalidArgument likewise.
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list);

}  // namespace ferry::coord
