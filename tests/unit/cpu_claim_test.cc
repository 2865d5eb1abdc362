// Host-wide CPU claims for io threads, and the CPU lists they are given.
#include "common/cpu_claim.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace ferry::cpus
