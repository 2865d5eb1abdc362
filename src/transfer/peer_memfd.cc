#include "transfer/peer_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace ferry {

Result<char*> MapPeerMemfd(uint32_t pid, int32_t memfd, uint64_t length) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(memfd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < length) {
    close(fd);
    return Status::IoError(path + " is smaller than its region");
  }
  // Populated here, off the data path: otherwise the first write into each
  // page of the peer's memory faults, and a put into a fresh mapping runs at
  // a fraction of memcpy speed.
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Status::FromErrno(err, "mmap " + path);
  return static_cast<char*>(p);
}

}  // namespace ferry
