// Host-wide CPU claims for io threads, the CPU lists they are given, and the
// count of CPUs the defaults follow.
#include "common/cpu_claim.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_quota.h"
#include "common/thread_pool.h"

namespace ferry::cpus {
namespace {

TEST(CpuList, ParsesNumbersAndRanges) {
  auto l = ParseList("0-3,8,10-10");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l.value(), (std::vector<int>{0, 1, 2, 3, 8, 10}));
}

TEST(CpuList, RefusesWhatIsNotAList) {
  for (const char* bad : {"", "abc", "3-1", "1,,2", "-1", "1-", "2x", "0-99999", ",", "1, 2"}) {
    auto l = ParseList(bad);
    ASSERT_FALSE(l.ok()) << "'" << bad << "'";
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << l.status().ToString();
  }
}

class CpuClaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "ferry-cpus-test-" + std::to_string(getpid());
    std::remove(path_.c_str());
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
  const std::vector<int> eight_{0, 1, 2, 3, 4, 5, 6, 7};
};

// Two engines of a host get different CPUs; a third, finding too few free,
// gets none rather than sharing; a released claim's CPUs are free again.
TEST_F(CpuClaimTest, ClaimsAreDisjointAllOrNoneAndReleased) {
  Claim a = Claim::Take(path_, eight_, 4);
  Claim b = Claim::Take(path_, eight_, 4);
  EXPECT_EQ(a.cpus(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(b.cpus(), (std::vector<int>{4, 5, 6, 7}));
  Claim c = Claim::Take(path_, eight_, 1);
  EXPECT_TRUE(c.cpus().empty());
  a.Release();
  EXPECT_TRUE(a.cpus().empty());
  Claim d = Claim::Take(path_, eight_, 2);
  EXPECT_EQ(d.cpus(), (std::vector<int>{0, 1}));
  {
    Claim moved = std::move(b);  // the claim goes with it, and ends with it
    EXPECT_TRUE(b.cpus().empty());
  }
  EXPECT_EQ(Claim::Take(path_, eight_, 6).cpus(), (std::vector<int>{2, 3, 4, 5, 6, 7}));
}

// A process that died holding CPUs (SIGKILL runs no destructor) holds them
// no longer.
TEST_F(CpuClaimTest, ADeadOwnersCpusAreFree) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Claim held = Claim::Take(path_, eight_, 8);
    _exit(held.cpus().size() == 8 ? 0 : 1);  // no destructor: the claim stays in the file
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child could not claim";
  EXPECT_EQ(Claim::Take(path_, eight_, 8).cpus(), eight_);
}

// A registry that is not this user's plain file is not used: no claim.
TEST_F(CpuClaimTest, AnUnusableRegistryGivesNoClaim) {
  EXPECT_TRUE(Claim::Take(::testing::TempDir(), eight_, 1).cpus().empty());  // a directory
  EXPECT_TRUE(Claim::Take(path_, eight_, 0).cpus().empty());
}

TEST(CpuPin, PinsTheCallingThreadToAnAllowedCpu) {
  const std::vector<int> allowed = Allowed();
  ASSERT_FALSE(allowed.empty());
  std::thread([&] {
    ASSERT_TRUE(PinThread(pthread_self(), allowed.back()).ok());
    EXPECT_EQ(Allowed(), std::vector<int>{allowed.back()});
  }).join();
  EXPECT_EQ(Allowed(), allowed) << "the caller's own CPUs are unchanged";
  EXPECT_EQ(PinThread(pthread_self(), -1).code(), StatusCode::kInvalidArgument);
}

TEST(CpuPin, ConfinesAPoolsThreadsToTheCpusGiven) {
  const std::vector<int> allowed = Allowed();
  ASSERT_FALSE(allowed.empty());
  const std::vector<int> first{allowed.front()};
  ThreadPool pool(2, "confine-test");
  ASSERT_TRUE(pool.Confine(first).ok());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int>> seen;
  for (int i = 0; i < 8; ++i) {
    pool.Post([&] {
      std::lock_guard lk(mu);
      seen.push_back(Allowed());
      cv.notify_all();
    });
  }
  std::unique_lock lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return seen.size() == 8; }));
  for (const auto& s : seen) EXPECT_EQ(s, first);
  EXPECT_EQ(pool.Confine({}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Confine({-1}).code(), StatusCode::kInvalidArgument);
}

TEST(CpuQuota, ReadsV2AndV1Quotas) {
  EXPECT_EQ(ParseCpuMax("200000 100000\n"), 2.0);
  EXPECT_EQ(ParseCpuMax("150000 100000"), 1.5);
  EXPECT_EQ(ParseCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ParseCfsQuota("50000\n", "100000\n"), 0.5);
  EXPECT_EQ(ParseCfsQuota("-1\n", "100000\n"), std::nullopt);
  for (const char* bad : {"", "max", "100000", "abc 100000", "100000 0", "0 100000", "-5 100000",
                          "1e5 100000", "100000 100000 7"}) {
    EXPECT_EQ(ParseCpuMax(bad), std::nullopt) << "'" << bad << "'";
  }
  EXPECT_EQ(ParseCfsQuota("", "100000"), std::nullopt);
  EXPECT_EQ(ParseCfsQuota("100000", "x"), std::nullopt);
}

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ::testing::TempDir() + "ferry-cgroup-test-" + std::to_string(getpid());
    std::filesystem::remove_all(base_);
    root_ = base_ + "/mnt";
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  void Put(const std::string& rel, const std::string& text) {
    const std::filesystem::path p = root_ + "/" + rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string base_, root_;  // root_, the mount, is in base_
};

// The tightest limit from the process's cgroup up to the top counts; a
// limit outside the path does not.
TEST_F(CgroupTree, V2TakesTheTightestLimitOnThePath) {
  Put("cpu.max", "max 100000\n");
  Put("kubepods/cpu.max", "800000 100000\n");
  Put("kubepods/pod1/cpu.max", "250000 100000\n");
  Put("kubepods/pod1/app/cpu.max", "max 100000\n");
  Put("kubepods/pod2/cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupQuota("0::/kubepods/pod1/app\n", root_), 2.5);
  EXPECT_EQ(CgroupQuota("0::/kubepods\n", root_), 8.0);
  EXPECT_EQ(CgroupQuota("0::/\n", root_), std::nullopt);
  EXPECT_EQ(CgroupQuota("", root_), std::nullopt);
}

// Inside a container the path can name a cgroup the container's mount does
// not show; its top, which is the container's own, still counts.
TEST_F(CgroupTree, APathTheMountDoesNotShowFallsBackToItsTop) {
  Put("cpu.max", "300000 100000\n");
  EXPECT_EQ(CgroupQuota("0::/docker/abc123\n", root_), 3.0);
  // Outside the namespace's view: never a file above the mount.
  Put("../cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupQuota("0::/../other\n", root_), 3.0);
}

TEST_F(CgroupTree, V1ReadsTheCpuControllerOnly) {
  Put("cpu,cpuacct/docker/c1/cpu.cfs_quota_us", "150000\n");
  Put("cpu,cpuacct/docker/c1/cpu.cfs_period_us", "100000\n");
  Put("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Put("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Put("memory/docker/c1/cpu.cfs_quota_us", "10000\n");  // not the cpu controller
  Put("memory/docker/c1/cpu.cfs_period_us", "100000\n");
  const char* self =
      "12:memory:/docker/c1\n"
      "4:cpu,cpuacct:/docker/c1\n"
      "1:name=systemd:/docker/c1\n"
      "0::/docker/c1\n";
  EXPECT_EQ(CgroupQuota(self, root_), 1.5);
  EXPECT_EQ(CgroupQuota("4:cpuacct:/docker/c1\n", root_), std::nullopt);
  EXPECT_EQ(CgroupQuota("not a cgroup line\n4:cpu\n::\n", root_), std::nullopt);
}

// Threads may run on as many CPUs as the affinity allows; a quota lowers
// only the CPU time, rounded up to whole CPUs.
TEST(CpuQuota, ParallelFollowsTheAffinityAndBudgetTheQuota) {
  const std::vector<int> allowed = Allowed();
  ASSERT_FALSE(allowed.empty());
  EXPECT_EQ(Parallel(), static_cast<int>(allowed.size()));
  EXPECT_GE(Budget(), 1);
  EXPECT_LE(Budget(), Parallel());
  std::thread([&] {
    ASSERT_TRUE(PinThread(pthread_self(), allowed.back()).ok());
    EXPECT_EQ(Parallel(), 1);
    EXPECT_EQ(Budget(), 1);
  }).join();
  EXPECT_EQ(BudgetOf(64, 2.0), 2);
  EXPECT_EQ(BudgetOf(64, 1.5), 2);
  EXPECT_EQ(BudgetOf(64, 0.5), 1);
  EXPECT_EQ(BudgetOf(2, 8.0), 2);
  EXPECT_EQ(BudgetOf(4, std::nullopt), 4);
}

}  // namespace
}  // namespace ferry::cpus
