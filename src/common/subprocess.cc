#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

namespace ferry {

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

Result<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                      bool capture_stdout) {
  if (argv.empty()) return Status::InvalidArgument("empty argv");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int fds[2] = {-1, -1};
  if (capture_stdout && pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe2");
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (capture_stdout) dup2(fds[1], STDOUT_FILENO);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  if (capture_stdout) close(fds[1]);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, capture_stdout ? fds[0] : -1));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

Result<std::string> Subprocess::ReadLine(Millis timeout) {
  Deadline deadline = Deadline::After(timeout);
  for (;;) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (out_fd_ < 0) return Status::InvalidArgument("stdout not captured");
    auto left = std::chrono::duration_cast<Millis>(deadline.Remaining()).count();
    if (left <= 0) return Status::Timeout("no line from child in time");
    pollfd p{out_fd_, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno != EINTR) return Status::FromErrno(errno, "poll");
    if (r <= 0) continue;
    char tmp[4096];
    ssize_t n = read(out_fd_, tmp, sizeof(tmp));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::ConnectionLost("child closed its stdout");
    buf_.append(tmp, static_cast<size_t>(n));
  }
}

Status Subprocess::Signal(int sig) {
  if (reaped_) return Status::NotFound("child already exited");
  if (kill(pid_, sig) != 0) return Status::FromErrno(errno, "kill");
  return Status::Ok();
}

Result<int> Subprocess::Wait(Millis timeout) {
  Deadline deadline = Deadline::After(timeout);
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (r < 0 && errno != EINTR) return Status::FromErrno(errno, "waitpid");
    if (deadline.Expired()) return Status::Timeout("child still running");
    std::this_thread::sleep_for(Millis(2));
  }
}

}  // namespace ferry
