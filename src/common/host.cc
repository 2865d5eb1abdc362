#include "common/host.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace ferry {

const std::string& HostIdentity() {
  static const std::string id = [] {
    std::string boot;
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
    if (boot.empty()) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      boot = name;
    }
    struct stat st {};
    unsigned long long ns = stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
    return boot + "/" + std::to_string(ns);
  }();
  return id;
}

std::string Unbracketed(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsLoopbackHost(const std::string& host) {
  const std::string h = Unbracketed(host);
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

}  // namespace ferry
