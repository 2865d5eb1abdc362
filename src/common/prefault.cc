#include "common/prefault.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry {

void Prefault(void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  size_t done = 0;
  int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    while (done < n) {
      ssize_t r = read(fd, c + done, std::min<size_t>(n - done, 1 << 20));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += static_cast<size_t>(r);
    }
    close(fd);
  }
  if (done < n) std::memset(c + done, 0, n - done);
}

}  // namespace ferry
