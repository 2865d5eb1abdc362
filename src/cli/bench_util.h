// Small helpers shared by the benchmarks: whole-buffer socket I/O and percentiles.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <vector>

namespace ferry::cli {

// Sends all `n` bytes; false when the peer closed or an error other than EINTR.
inline bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Receives exactly `n` bytes; false on EOF, timeout or error.
inline bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The p-quantile (0..1) of `v`, reordering it; 0 for an empty vector.
inline double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

}  // namespace ferry::cli
