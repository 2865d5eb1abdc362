// Redis as the store benchmark's comparison: a Debian redis-server on a
// loopback port in a temporary directory, with no persistence, and a minimal
// RESP client of our own (pipelined SET and GET over several connections).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "ferry/status.h"

namespace ferry::cli {

class RedisReference {
 public:
  // Starts redis-server (found on PATH or in /usr/bin) and opens `connections`
  // connections to it. Unavailable when redis-server is missing or silent.
  static Result<std::unique_ptr<RedisReference>> Start(int connections);
  ~RedisReference();

  // SETs keys[i] = values[i], spreading the items over the connections, each
  // pipelining its share. Returns the seconds it took.
  Result<double> Set(const std::vector<std::string>& keys,
                     const std::vector<std::span<const uint8_t>>& values);
  // GETs keys[i] into dst[i], which must be exactly the value's size.
  Result<double> Get(const std::vector<std::string>& keys,
                     const std::vector<std::span<uint8_t>>& dst);

 private:
  RedisReference() = default;
  std::unique_ptr<Subprocess> server_;
  std::string dir_;
  std::vector<int> fds_;
};

}  // namespace ferry::cli
