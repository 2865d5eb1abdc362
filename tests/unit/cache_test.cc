// WriteBackForDma's modes (FERRY_STAGING_WRITEBACK): each leaves the bytes
// as they were, written back by any thread or by the one that wrote them, and
// the mode a process runs is the one it asked for where the CPU has the
// instruction; unset, the default (4).
#include "common/cache.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/held_work.h"

namespace ferry {
namespace {

bool CpuHas(int mode) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (mode == 1) return __builtin_cpu_supports("clwb");
  if (mode == 2) return __builtin_cpu_supports("clflushopt");
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (mode == 3) return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && ((c >> 25) & 1);
#endif
  (void)mode;
  return false;
}

// The mode is read once a process, so each runs in a child of its own: its
// exit code is the mode it ran, or 9 when the bytes changed.
// Null `value`: unset.
int ModeInAChild(const char* value) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (value != nullptr) setenv("FERRY_STAGING_WRITEBACK", value, 1);
    std::vector<unsigned char> buf(300001);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7);
    WriteBackForDma(buf.data() + 3, buf.size() - 3);  // unaligned at both ends
    WriteBackOwnForDma(buf.data() + 1, buf.size() - 2);
    WriteBackOwnForDmaUnfenced(buf.data() + 5, 1000);
    for (size_t i = 0; i < buf.size(); ++i) {
      if (buf[i] != static_cast<unsigned char>(i * 7)) _exit(9);
    }
    _exit(DmaWriteBackMode());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(DmaWriteBack, EachModeKeepsTheBytesAndRunsWhereTheCpuCan) {
  EXPECT_EQ(ModeInAChild("0"), 0);
  EXPECT_EQ(ModeInAChild("1"), CpuHas(1) ? 1 : 0);
  EXPECT_EQ(ModeInAChild("2"), CpuHas(2) ? 2 : 0);
  EXPECT_EQ(ModeInAChild("3"), CpuHas(3) ? 3 : 0);
  EXPECT_EQ(ModeInAChild("4"), CpuHas(1) ? 4 : 0);
  EXPECT_EQ(ModeInAChild(nullptr), CpuHas(1) ? 4 : 0);
}

// A receive's callback follows the parts as they are filled, and without a
// start it does nothing.
TEST(DmaWriteBack, AsFilledFollowsTheParts) {
  std::vector<char> buf(6000, 'x');
  WriteBackAsFilled filled{buf.data() + 1};
  for (uint64_t n : {100, 0, 4899}) filled(n);
  EXPECT_EQ(filled.at, buf.data() + 5000);
  EXPECT_EQ(std::count(buf.begin(), buf.end(), 'x'), 6000);
  WriteBackAsFilled none;
  none(10);
  EXPECT_EQ(none.at, nullptr);
}

TEST(DmaWriteBack, OnlyZeroToFourAreAccepted) {
  for (const char* bad : {"5", "-1", "evict"}) {
    setenv("FERRY_STAGING_WRITEBACK", bad, 1);
    Status st = CheckWriteBackEnv();
    unsetenv("FERRY_STAGING_WRITEBACK");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("FERRY_STAGING_WRITEBACK"), std::string::npos) << st.ToString();
  }
  for (const char* good : {"0", "1", "2", "3", "4"}) {
    setenv("FERRY_STAGING_WRITEBACK", good, 1);
    Status st = CheckWriteBackEnv();
    unsetenv("FERRY_STAGING_WRITEBACK");
    EXPECT_TRUE(st.ok()) << good << ": " << st.ToString();
  }
}

// Past its depth the oldest runs, not early; RunAll runs the rest early,
// oldest first; another thread's work is its own.
TEST(HeldWork, RunsTheOldestPastItsDepthAndTheRestOnRunAll) {
  std::string ran;
  auto work = [&ran](char name) {
    return [&ran, name](bool early) { ran += std::string(1, name) + (early ? "!" : "."); };
  };
  held::Hold(2, work('a'));
  held::Hold(2, work('b'));
  EXPECT_EQ(ran, "");
  held::Hold(2, work('c'));
  EXPECT_EQ(ran, "a.");
  std::thread([&] { held::RunAll(); }).join();
  EXPECT_EQ(ran, "a.");
  held::Hold(1, work('d'));  // a smaller depth runs what is past it
  EXPECT_EQ(ran, "a.b.c.");
  held::RunAll();
  EXPECT_EQ(ran, "a.b.c.d!");
  held::RunAll();
  EXPECT_EQ(ran, "a.b.c.d!");
  held::Hold(0, work('e'));  // depth 0: runs now
  EXPECT_EQ(ran, "a.b.c.d!e.");
}

}  // namespace
}  // namespace ferry
