#include "common/cpu_claim.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>

namespace ferry::cpus {
namespace {

// One owner pid (0: none) per CPU number.
constexpr size_t kSlots = CPU_SETSIZE;
using Table = std::vector<int32_t>;

bool Alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// The registry, opened and locked; -1 when it cannot be used (made by
// another user, say), which leaves the threads unpinned.
int OpenLocked(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || !S_ISREG(st.st_mode) ||
      flock(fd, LOCK_EX) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

Table ReadTable(int fd) {
  Table t(kSlots, 0);
  const ssize_t n = pread(fd, t.data(), t.size() * sizeof(int32_t), 0);
  if (n < 0) return Table(kSlots, 0);
  return t;  // a short file leaves the rest unclaimed
}

bool WriteTable(int fd, const Table& t) {
  const size_t bytes = t.size() * sizeof(int32_t);
  return pwrite(fd, t.data(), bytes, 0) == static_cast<ssize_t>(bytes);
}

}  // namespace

std::vector<int> Allowed(pid_t tid) {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(tid, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

Result<std::vector<int>> ParseList(std::string_view text) {
  auto bad = [&] {
    std::string msg = "not a list of CPUs such as 0-7,12: '";
    msg.append(text).append("'");
    return Status::InvalidArgument(msg);
  };
  std::vector<int> out;
  if (text.empty()) return bad();
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string_view part = text.substr(at, end - at);
    int lo = -1, hi = -1;
    const char* p = part.data();
    const char* e = part.data() + part.size();
    auto r = std::from_chars(p, e, lo);
    if (r.ec != std::errc() || r.ptr == p) return bad();
    hi = lo;
    if (r.ptr != e) {
      if (*r.ptr != '-') return bad();
      auto r2 = std::from_chars(r.ptr + 1, e, hi);
      if (r2.ec != std::errc() || r2.ptr != e || r2.ptr == r.ptr + 1) return bad();
    }
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return bad();
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    at = end + 1;
  }
  return out;
}

Status PinThread(pthread_t thread, int cpu) { return ConfineThread(thread, {cpu}); }

Status ConfineThread(pthread_t thread, const std::vector<int>& cpus) {
  if (cpus.empty()) return Status::InvalidArgument("no CPUs to run on");
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string named;
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return Status::InvalidArgument("no such CPU");
    CPU_SET(cpu, &set);
    if (!named.empty()) named += ',';
    named += std::to_string(cpu);
  }
  const int err = pthread_setaffinity_np(thread, sizeof(set), &set);
  if (err != 0) {
    return Status::InvalidArgument("cannot run on CPU " + named + ": " + std::strerror(err));
  }
  return Status::Ok();
}

std::string DefaultRegistry() { return "/dev/shm/ferry-cpus-" + std::to_string(geteuid()); }

Claim Claim::Take(const std::string& path, const std::vector<int>& allowed, size_t n) {
  Claim c;
  if (n == 0) return c;
  const int fd = OpenLocked(path);
  if (fd < 0) return c;
  Table t = ReadTable(fd);
  std::vector<int> mine;
  for (int cpu : allowed) {
    if (mine.size() == n) break;
    if (cpu < 0 || static_cast<size_t>(cpu) >= kSlots) continue;
    if (!Alive(t[static_cast<size_t>(cpu)])) mine.push_back(cpu);
  }
  if (mine.size() == n) {
    for (int cpu : mine) t[static_cast<size_t>(cpu)] = static_cast<int32_t>(getpid());
    if (WriteTable(fd, t)) {
      c.path_ = path;
      c.cpus_ = std::move(mine);
    }
  }
  close(fd);  // and the lock with it
  return c;
}

Claim& Claim::operator=(Claim&& o) noexcept {
  if (this != &o) {
    Release();
    path_ = std::move(o.path_);
    cpus_ = std::move(o.cpus_);
    o.cpus_.clear();
  }
  return *this;
}

void Claim::Release() {
  if (cpus_.empty()) return;
  const int fd = OpenLocked(path_);
  if (fd >= 0) {
    Table t = ReadTable(fd);
    const auto me = static_cast<int32_t>(getpid());
    for (int cpu : cpus_) {
      if (t[static_cast<size_t>(cpu)] == me) t[static_cast<size_t>(cpu)] = 0;
    }
    (void)WriteTable(fd, t);
    close(fd);
  }
  cpus_.clear();
}

}  // namespace ferry::cpus
