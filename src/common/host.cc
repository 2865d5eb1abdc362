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

bool IsLoopbackHost(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

}  // namespace ferry
