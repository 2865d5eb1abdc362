#include "common/cpu_quota.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/cpu_claim.h"

namespace ferry::cpus {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

std::optional<int64_t> Int(std::string_view s) {
  int64_t v = 0;
  const char* e = s.data() + s.size();
  auto r = std::from_chars(s.data(), e, v);
  if (r.ec != std::errc() || r.ptr != e || s.empty()) return std::nullopt;
  return v;
}

std::optional<double> Ratio(std::optional<int64_t> quota, std::optional<int64_t> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<std::string> ReadSmall(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void Tighten(std::optional<double>& best, std::optional<double> q) {
  if (q && (!best || *q < *best)) best = q;
}

// `path` and each of its parents up to "/", inside the mount at `mount`.
std::vector<std::string> Upward(const std::string& mount, std::string_view path) {
  std::vector<std::string> dirs;
  std::string p(path);
  while (!p.empty() && p.back() == '/') p.pop_back();
  for (;;) {
    dirs.push_back(mount + p);
    if (p.empty()) break;
    p.erase(p.rfind('/'));
  }
  return dirs;
}

bool HasCpuController(std::string_view controllers) {
  while (!controllers.empty()) {
    const size_t comma = std::min(controllers.find(','), controllers.size());
    if (controllers.substr(0, comma) == "cpu") return true;
    controllers.remove_prefix(std::min(comma + 1, controllers.size()));
  }
  return false;
}

}  // namespace

std::optional<double> ParseCpuMax(std::string_view text) {
  text = Trim(text);
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  if (text.substr(0, space) == "max") return std::nullopt;
  return Ratio(Int(text.substr(0, space)), Int(Trim(text.substr(space + 1))));
}

std::optional<double> ParseCfsQuota(std::string_view quota, std::string_view period) {
  return Ratio(Int(Trim(quota)), Int(Trim(period)));
}

std::optional<double> CgroupQuota(std::string_view proc_cgroup, const std::string& root) {
  std::optional<double> best;
  while (!proc_cgroup.empty()) {
    const size_t nl = std::min(proc_cgroup.find('\n'), proc_cgroup.size());
    const std::string_view line = proc_cgroup.substr(0, nl);
    proc_cgroup.remove_prefix(std::min(nl + 1, proc_cgroup.size()));
    // "hierarchy-id:controllers:path"; v2 is "0::path".
    const size_t a = line.find(':');
    const size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos || line.size() <= b + 1 || line[b + 1] != '/') continue;
    const std::string_view controllers = line.substr(a + 1, b - a - 1);
    std::string_view path = line.substr(b + 1);
    // A cgroup outside this namespace's view ("/../x"): the view's top is
    // the nearest that the mount shows.
    if (path.find("/..") != std::string_view::npos) path = "/";
    if (line.substr(0, a) == "0" && controllers.empty()) {
      for (const std::string& mount : {root, root + "/unified"}) {
        for (const std::string& dir : Upward(mount, path)) {
          if (auto t = ReadSmall(dir + "/cpu.max")) Tighten(best, ParseCpuMax(*t));
        }
      }
    } else if (HasCpuController(controllers)) {
      for (const std::string& mount : {root + "/cpu", root + "/cpu,cpuacct"}) {
        for (const std::string& dir : Upward(mount, path)) {
          auto q = ReadSmall(dir + "/cpu.cfs_quota_us");
          auto p = ReadSmall(dir + "/cpu.cfs_period_us");
          if (q && p) Tighten(best, ParseCfsQuota(*q, *p));
        }
      }
    }
  }
  return best;
}

int Parallel() {
  const int n = static_cast<int>(Allowed().size());
  return std::max(n > 0 ? n : static_cast<int>(std::thread::hardware_concurrency()), 1);
}

int BudgetOf(int parallel, std::optional<double> quota) {
  if (quota) parallel = std::min(parallel, static_cast<int>(std::ceil(*quota)));
  return std::max(parallel, 1);
}

int Budget() {
  std::optional<double> quota;
  // The calling thread's cgroups, which the threads it starts inherit (v1
  // can hold a process's threads in different ones).
  auto text = ReadSmall("/proc/thread-self/cgroup");
  if (!text) text = ReadSmall("/proc/self/cgroup");
  if (text) quota = CgroupQuota(*text, "/sys/fs/cgroup");
  return BudgetOf(Parallel(), quota);
}

}  // namespace ferry::cpus
