#include "cli/redis_reference.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cli/bench_util.h"
#include "cli/local_cluster.h"
#include "common/clock.h"

namespace ferry::cli {
namespace {

int ConnectLoopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{30, 0};  // every read and write has a deadline
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

// Reads one CRLF-terminated line of at most 64 bytes.
bool ReadLine(int fd, std::string* line) {
  line->clear();
  char c = 0;
  while (line->size() < 64) {
    if (!ReadAll(fd, &c, 1)) return false;
    if (c == '\n' && !line->empty() && line->back() == '\r') {
      line->pop_back();
      return true;
    }
    line->push_back(c);
  }
  return false;
}

// The RESP array header of `cmd key [value]`, up to the value's bytes.
std::string BulkHeader(const char* cmd, const std::string& key, size_t value_len, bool has_value) {
  std::string h = fmt::format("*{}\r\n${}\r\n{}\r\n${}\r\n{}\r\n", has_value ? 3 : 2,
                              std::strlen(cmd), cmd, key.size(), key);
  if (has_value) h += fmt::format("${}\r\n", value_len);
  return h;
}

// Runs `work(connection index, fd)` on every connection at once; the seconds
// until all finished, or the first error.
template <typename F>
Result<double> OnAll(const std::vector<int>& fds, F&& work) {
  std::vector<Status> st(fds.size());
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (size_t c = 0; c < fds.size(); ++c) {
    threads.emplace_back([&, c] { st[c] = work(c, fds[c]); });
  }
  for (auto& t : threads) t.join();
  const double secs = SecondsSince(t0);
  for (const auto& s : st) FERRY_RETURN_IF_ERROR(s);
  return secs;
}

}  // namespace

Result<std::unique_ptr<RedisReference>> RedisReference::Start(int connections) {
  // FERRY_REDIS_SERVER: a redis-server carried to a machine without Debian's.
  const char* env = std::getenv("FERRY_REDIS_SERVER");
  std::string bin = env != nullptr && *env != '\0' ? env : "/usr/bin/redis-server";
  if (access(bin.c_str(), X_OK) != 0) {
    return Status::Unavailable(bin +
                               " is not installed (scripts/install-deps, or FERRY_REDIS_SERVER)");
  }
  std::unique_ptr<RedisReference> r(new RedisReference());
  char tmpl[] = "/tmp/ferry-redis-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::FromErrno(errno, "mkdtemp");
  r->dir_ = tmpl;
  FERRY_ASSIGN_OR_RETURN(uint16_t port, FreePort());
  FERRY_ASSIGN_OR_RETURN(
      r->server_, Subprocess::Spawn(
                      {bin, "--port", std::to_string(port), "--bind", "127.0.0.1", "--dir", r->dir_,
                       "--save", "", "--appendonly", "no", "--logfile", r->dir_ + "/log"},
                      false));
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (static_cast<int>(r->fds_.size()) < connections) {
    int fd = ConnectLoopback(port);
    if (fd >= 0) {
      r->fds_.push_back(fd);
      continue;
    }
    if (deadline.Expired()) return Status::Unavailable("redis-server did not start");
    std::this_thread::sleep_for(Millis(20));
  }
  return r;
}

RedisReference::~RedisReference() {
  for (int fd : fds_) close(fd);
  server_.reset();  // SIGKILL and reap
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

Result<double> RedisReference::Set(const std::vector<std::string>& keys,
                                   const std::vector<std::span<const uint8_t>>& values) {
  const size_t n = fds_.size();
  return OnAll(fds_, [&](size_t c, int fd) -> Status {
    size_t sent = 0;
    for (size_t i = c; i < keys.size(); i += n) {
      std::string h = BulkHeader("SET", keys[i], values[i].size(), true);
      if (!WriteAll(fd, h.data(), h.size()) || !WriteAll(fd, values[i].data(), values[i].size()) ||
          !WriteAll(fd, "\r\n", 2)) {
        return Status::ConnectionLost("redis SET: send failed");
      }
      ++sent;
    }
    std::string line;
    for (size_t k = 0; k < sent; ++k) {
      if (!ReadLine(fd, &line) || line != "+OK") {
        return Status::ProtocolError("redis SET answered '" + line + "'");
      }
    }
    return Status::Ok();
  });
}

Result<double> RedisReference::Get(const std::vector<std::string>& keys,
                                   const std::vector<std::span<uint8_t>>& dst) {
  const size_t n = fds_.size();
  return OnAll(fds_, [&](size_t c, int fd) -> Status {
    std::string cmds;
    for (size_t i = c; i < keys.size(); i += n) cmds += BulkHeader("GET", keys[i], 0, false);
    if (!WriteAll(fd, cmds.data(), cmds.size())) {
      return Status::ConnectionLost("redis GET: send failed");
    }
    std::string line;
    char crlf[2];
    for (size_t i = c; i < keys.size(); i += n) {
      if (!ReadLine(fd, &line) || line != fmt::format("${}", dst[i].size()) ||
          !ReadAll(fd, dst[i].data(), dst[i].size()) || !ReadAll(fd, crlf, 2)) {
        return Status::ProtocolError("redis GET answered '" + line + "'");
      }
    }
    return Status::Ok();
  });
}

}  // namespace ferry::cli
