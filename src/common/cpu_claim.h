// CPUs of their own for the engine's io threads. An io thread that the
// scheduler moves between CPUs costs a large host throughput (on the H200
// machine, 16 vCPUs, tcp moved 8-18% more with each io thread on one CPU:
// docs/performance.md), but two engines on one host must not put their io
// threads on the same CPUs. So CPUs are claimed host-wide in a small
// registry file, one owner pid per CPU, read and written under flock(2):
// a claim takes only CPUs that no live process holds, and is given back
// when its owner lets go of it (or dies: a dead pid's CPU is free again).
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::cpus {

// The CPUs the thread `tid` (0: the calling thread) may run on, ascending;
// none when it cannot be read.
std::vector<int> Allowed(pid_t tid = 0);

// "0-7,12" -> {0, ..., 7, 12}: numbers and ranges, comma-separated, each
// under CPU_SETSIZE. InvalidArgument naming `text` when it is not such a list.
Result<std::vector<int>> ParseList(std::string_view text);

// Keeps `thread` on `cpu` from now on.
Status PinThread(pthread_t thread, int cpu);
// Keeps `thread` on any of `cpus` (not empty) from now on.
Status ConfineThread(pthread_t thread, const std::vector<int>& cpus);

// The registry of this user's claims: /dev/shm/ferry-cpus-<uid>.
std::string DefaultRegistry();

class Claim {
 public:
  Claim() = default;
  // Up to `n` CPUs of `allowed`, in its order, that no live process holds
  // in the registry at `path`: all n, or none when fewer are free or the
  // registry cannot be used. Never blocks for long: flock is held for one
  // read and one write of the file.
  static Claim Take(const std::string& path, const std::vector<int>& allowed, size_t n);
  ~Claim() { Release(); }
  Claim(Claim&& o) noexcept : path_(std::move(o.path_)), cpus_(std::move(o.cpus_)) {
    o.cpus_.clear();
  }
  Claim& operator=(Claim&& o) noexcept;
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

  const std::vector<int>& cpus() const { return cpus_; }
  // Frees this claim's CPUs in the registry (those it still holds).
  void Release();

 private:
  std::string path_;
  std::vector<int> cpus_;
};

}  // namespace ferry::cpus
