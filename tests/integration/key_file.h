// A cluster-secret file for tests (common/auth.h): written with the mode
// asked for, removed when the object goes.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>

namespace ferry::test {

class KeyFile {
 public:
  // "/tmp/ferry-test-<pid>-<name>.key" holding `secret`, of mode `mode`.
  KeyFile(const std::string& name, std::string_view secret, mode_t mode = 0600)
      : path_("/tmp/ferry-test-" + std::to_string(getpid()) + "-" + name + ".key") {
    unlink(path_.c_str());
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ok_ = write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size()) &&
          fchmod(fd, mode) == 0;
    close(fd);
  }
  ~KeyFile() { unlink(path_.c_str()); }
  KeyFile(const KeyFile&) = delete;
  KeyFile& operator=(const KeyFile&) = delete;

  const std::string& path() const { return path_; }
  bool ok() const { return ok_; }  // written as asked

 private:
  std::string path_;
  bool ok_ = false;
};

}  // namespace ferry::test
