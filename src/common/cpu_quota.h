// How many CPUs the engine sizes itself for. Its defaults follow what a
// process may use, not the host's count, in two ways: how many of its
// threads can run at once (its CPU affinity: taskset, a container's cpuset)
// and how much CPU time it may burn (that, or less under a cgroup CPU quota:
// docker --cpus, a Kubernetes CPU limit). Threads and lanes follow the
// first; polling, which spends time to save a wake-up, the second. On the
// 2-core VM with a quota of 1 CPU, 2 io threads a process moved 7-64%
// more than 1 (docs/performance.md, 2026-12-05).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ferry::cpus {

// The CPUs the calling thread may run on at once (its affinity); at least
// 1. Reads /proc and /sys on each call: for start-up, not hot paths.
int Parallel();

// The CPUs' worth of time the calling thread (and the threads it starts)
// may use: Parallel(), or fewer where a cgroup CPU quota on its path allows
// less (rounded up); at least 1.
int Budget();

// Budget() from its parts: `parallel` CPUs and a quota of `quota` CPUs.
int BudgetOf(int parallel, std::optional<double> quota);

// A cgroup v2 `cpu.max` ("200000 100000" is 2 CPUs, "max 100000" no limit)
// as CPUs. nullopt where there is no limit or the text is not such a value.
std::optional<double> ParseCpuMax(std::string_view text);

// cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us` as CPUs; a quota
// of -1 is no limit. nullopt as for ParseCpuMax.
std::optional<double> ParseCfsQuota(std::string_view quota, std::string_view period);

// The tightest CPU quota on this process's cgroup paths, given the text of
// /proc/thread-self/cgroup and the folder the cgroup file systems are mounted in
// (/sys/fs/cgroup): v2 there or in its `unified` folder, v1's cpu
// controller in `cpu` or `cpu,cpuacct`. Each path is read from its cgroup
// up to the top, because a parent's limit binds its children, and because
// inside a container the path often names a cgroup that the container sees
// as its top. nullopt: no limit found.
std::optional<double> CgroupQuota(std::string_view proc_cgroup, const std::string& root);

}  // namespace ferry::cpus
