#include "common/host.h"

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

}  // namespace ferry
