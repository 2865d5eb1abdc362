#include "coord/etcd_url.h"

#include <charconv>

namespace ferry::coord {
namespace {

constexpr size_t kMaxClusterName = 128;

Status CheckEndpoint(std::string_view ep) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("etcd endpoint '" + std::string(ep) + "' " + std::string(why));
  };
  if (ep.empty()) return bad("is empty");
  if (ep.find("://") != std::string_view::npos) return bad("must be host:port, with no scheme");
  size_t colon = ep.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad("is not host:port");
  std::string_view host = ep.substr(0, colon);
  std::string_view port_s = ep.substr(colon + 1);
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : host.find(':') != std::string_view::npos) {
    return bad("has a malformed host (bracket IPv6 literals)");
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
  if (port_s.empty() || ec != std::errc() || ptr != port_s.data() + port_s.size() || port == 0 ||
      port > 65535) {
    return bad("has no port in 1..65535");
  }
  for (char c : host) {
    if (c == '/' || c == ',' || c == ' ' || c == '@') return bad("has a malformed host");
  }
  return Status::Ok();
}

}  // namespace

bool IsEtcdUrl(std::string_view s) { return s.starts_with(kEtcdScheme); }

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<std::string> out;
  if (list.empty())
    return Status::InvalidArgument("no etcd endpoint given (host:port[,host:port])");
  size_t start = 0;
  while (true) {
    size_t comma = list.find(',', start);
    std::string_view ep =
        list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    FERRY_RETURN_IF_ERROR(CheckEndpoint(ep));
    out.emplace_back(ep);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

Result<EtcdUrl> ParseEtcdUrl(std::string_view url) {
  const std::string shown(url);
  if (!IsEtcdUrl(url)) {
    return Status::InvalidArgument("'" + shown + "' is not etcd://host:port[,host:port]/CLUSTER");
  }
  std::string_view rest = url.substr(kEtcdScheme.size());
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    return Status::InvalidArgument("'" + shown + "' names no cluster (etcd://ENDPOINTS/CLUSTER)");
  }
  EtcdUrl out;
  auto eps = ParseEtcdEndpoints(rest.substr(0, slash));
  if (!eps.ok()) return Status::InvalidArgument("'" + shown + "': " + eps.status().message());
  out.endpoints = std::move(eps).value();
  std::string_view cluster = rest.substr(slash + 1);
  if (cluster.empty() || cluster.size() > kMaxClusterName) {
    return Status::InvalidArgument("'" + shown + "': the cluster name must have 1 to " +
                                   std::to_string(kMaxClusterName) + " characters");
  }
  for (char c : cluster) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.';
    if (!ok) {
      return Status::InvalidArgument("'" + shown +
                                     "': the cluster name may hold only letters, digits, '-', "
                                     "'_' and '.'");
    }
  }
  out.cluster = std::string(cluster);
  return out;
}

}  // namespace ferry::coord
