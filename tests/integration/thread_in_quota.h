// A test's calling thread in a cgroup of its own with a CPU quota.
#pragma once

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace ferry {

// The calling thread in a cgroup of its own with a CPU quota, for as long as
// this lives (cgroup v1 moves one thread; those it starts follow it).
// `why` says what failed where it could not join one.
class ThreadInQuota {
 public:
  explicit ThreadInQuota(const std::string& quota_us) {
    std::ifstream self("/proc/thread-self/cgroup");
    std::string line, path;
    while (std::getline(self, line)) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      if (b != std::string::npos && line.substr(a + 1, b - a - 1) == "cpu")
        path = line.substr(b + 1);
    }
    const std::string mount = "/sys/fs/cgroup/cpu";
    if (path.empty() || !std::filesystem::exists(mount + path + "/tasks")) {
      why_ = "no cgroup v1 cpu controller at " + mount;
      return;
    }
    if (path.back() != '/') path += '/';
    back_ = mount + path + "tasks";
    dir_ = mount + path + "ferry-test-" + std::to_string(getpid());
    std::error_code ec;
    std::filesystem::create_directory(dir_, ec);
    if (ec) {
      why_ = "cannot make " + dir_ + ": " + ec.message();
      dir_.clear();
      return;
    }
    joined_ =
        Put(dir_ + "/cpu.cfs_quota_us", quota_us) && Put(dir_ + "/tasks", std::to_string(gettid()));
    if (!joined_) why_ = "cannot set a quota in " + dir_ + " or join it";
  }
  ~ThreadInQuota() {
    if (joined_) Put(back_, std::to_string(gettid()));
    // The engine's threads leave the cgroup as they exit.
    for (int i = 0; !dir_.empty() && i < 200 && rmdir(dir_.c_str()) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  bool joined() const { return joined_; }
  const std::string& why() const { return why_; }

 private:
  static bool Put(const std::string& file, const std::string& text) {
    std::ofstream out(file);
    out << text << std::flush;
    return out.good();
  }
  std::string dir_, back_, why_;
  bool joined_ = false;
};

}  // namespace ferry
