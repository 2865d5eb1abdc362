#include "integration/peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/cpu_claim.h"
#include "transfer/frame_wire.h"

namespace ferry::test {

uint16_t Peer::port() const {
  return static_cast<uint16_t>(std::stoi(segment.substr(segment.rfind(':') + 1)));
}

int ListenOnLoopback(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

std::thread AnswerOneDescriptorFetch(int lfd, std::vector<uint8_t> payload) {
  return std::thread([lfd, payload = std::move(payload)] {
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    uint8_t in[wire::kHeaderSize];
    recv(fd, in, sizeof(in), MSG_WAITALL);
    uint8_t h[wire::kHeaderSize];
    wire::EncodeHeader({wire::Opcode::kDescriptor, StatusCode::kOk, 1, 0, payload.size()}, h);
    send(fd, h, sizeof(h), MSG_NOSIGNAL);
    send(fd, payload.data(), payload.size(), MSG_NOSIGNAL);
    close(fd);
  });
}

std::string FerryBin() {
  const char* env = std::getenv("FERRY_BIN");
  return env != nullptr && *env != '\0' ? env : FERRY_BIN;
}

Result<nlohmann::json> RunBench(std::vector<std::string> args) {
  args.insert(args.begin(), {FerryBin(), "bench", "transfer"});
  args.push_back("--json");
  FERRY_ASSIGN_OR_RETURN(auto p, Subprocess::Spawn(args, true));
  nlohmann::json j;
  for (int i = 0; i < 10 && j.is_null(); ++i) {
    auto line = p->ReadLine(std::chrono::seconds(60));
    if (!line.ok()) return line.status();
    const std::string& text = line.value();
    if (!text.empty() && text[0] == '{') j = nlohmann::json::parse(text, nullptr, false);
  }
  FERRY_ASSIGN_OR_RETURN(int rc, p->Wait(std::chrono::seconds(30)));
  if (rc != 0) return Status::Internal("ferry bench transfer exited " + std::to_string(rc));
  if (!j.is_object()) return Status::Internal("ferry bench transfer printed no JSON line");
  return j;
}

std::vector<TraceEvent> ReadTrace(const std::string& dir) {
  std::vector<TraceEvent> events;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(f.path());
    long long ns;
    unsigned stage;
    std::string key;
    while (in >> ns >> stage >> key) events.push_back({ns, stage, std::stoull(key, nullptr, 16)});
  }
  std::sort(events.begin(), events.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.ns < b.ns; });
  return events;
}

std::vector<std::vector<int>> CpusOfThreadsNamed(const std::string& name) {
  std::vector<std::vector<int>> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    if (!std::getline(comm, got) || got != name) continue;
    std::vector<int> cpus = cpus::Allowed(std::stoi(task.path().filename()));
    if (!cpus.empty()) out.push_back(std::move(cpus));
  }
  return out;
}

Result<nlohmann::json> RunTracedBench(std::vector<std::string> args,
                                      std::vector<TraceEvent>* events) {
  char dir[] = "/tmp/ferry-trace-XXXXXX";
  if (mkdtemp(dir) == nullptr) return Status::FromErrno(errno, "mkdtemp");
  setenv("FERRY_TRACE_FILE", (std::string(dir) + "/t").c_str(), 1);
  args.insert(args.begin(), {"--transport", "tcp", "--block-size", "1MiB", "--batch-size", "4",
                             "--duration", "0.2"});
  auto j = RunBench(std::move(args));
  unsetenv("FERRY_TRACE_FILE");
  *events = ReadTrace(dir);
  std::filesystem::remove_all(dir);
  return j;
}

Result<Peer> StartPeer(uint64_t alloc_bytes, uint64_t heap_bytes, uint16_t port, uint64_t gpu_bytes,
                       int gpu_device, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {FerryBin(),     "serve",
                                   "--alloc",      std::to_string(alloc_bytes),
                                   "--heap",       std::to_string(heap_bytes),
                                   "--port",       std::to_string(port),
                                   "--gpu-alloc",  std::to_string(gpu_bytes),
                                   "--gpu-device", std::to_string(gpu_device)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto proc = Subprocess::Spawn(argv, true);
  if (!proc.ok()) return proc.status();
  auto line = proc.value()->ReadLine(std::chrono::seconds(20));
  if (!line.ok()) return line.status();
  auto j = nlohmann::json::parse(line.value(), nullptr, false);
  if (j.is_discarded()) return Status::Internal("peer said: " + line.value());
  Peer p;
  p.proc = std::move(proc).value();
  p.segment = j["segment"];
  p.epoch = j["epoch"];
  if (j.contains("alloc")) {
    p.alloc_addr = j["alloc"]["addr"];
    p.alloc_len = j["alloc"]["length"];
  }
  if (j.contains("gpu")) {
    p.gpu_addr = j["gpu"]["addr"];
    p.gpu_len = j["gpu"]["length"];
  }
  if (j.contains("heap")) {
    p.heap_addr = j["heap"]["addr"];
    p.heap_len = j["heap"]["length"];
  }
  return p;
}

void FillRandom(void* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    c[i] = static_cast<unsigned char>(x >> (8 * (i % 8)));
  }
}

}  // namespace ferry::test
