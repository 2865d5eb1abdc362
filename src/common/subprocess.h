// A child process with its stdout on a pipe. Used by the CLI (bench, demo) and
// by tests that need a peer in another process. The child is killed with
// SIGKILL if this process dies, and by the destructor if still running.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"

namespace ferry {

class Subprocess {
 public:
  // Starts argv[0] with `argv`. With capture_stdout, ReadLine reads its stdout.
  static Result<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv,
                                                   bool capture_stdout);
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // The next line of stdout without its newline. Timeout, or ConnectionLost at EOF.
  Result<std::string> ReadLine(Millis timeout);
  Status Signal(int sig);
  // The exit code, or 128+signal. Timeout if it is still running.
  Result<int> Wait(Millis timeout);

 private:
  Subprocess(pid_t pid, int out_fd) : pid_(pid), out_fd_(out_fd) {}
  pid_t pid_;
  int out_fd_;
  bool reaped_ = false;
  std::string buf_;
};

// The path of the running executable.
std::string SelfExe();

}  // namespace ferry
