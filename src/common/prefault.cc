#include "common/prefault.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace ferry {

namespace {
// The whole pages that hold [p, p+n).
bool PageSpan(void* p, size_t n, uintptr_t* start, size_t* len) {
  if (p == nullptr || n == 0) return false;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  *start = a & ~(page - 1);
  *len = ((a + n + page - 1) & ~(page - 1)) - *start;
  return true;
}
}  // namespace

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

bool PopulateWritable(void* p, size_t n) {
  uintptr_t start;
  size_t len;
  if (!PageSpan(p, n, &start, &len)) return false;
  int rc;
  do {
    rc = madvise(reinterpret_cast<void*>(start), len, MADV_POPULATE_WRITE);
  } while (rc != 0 && errno == EINTR);
  return rc == 0;
}

void AdviseHugePages(void* p, size_t n) {
  uintptr_t start;
  size_t len;
  if (PageSpan(p, n, &start, &len))
    (void)madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);
}

}  // namespace ferry
