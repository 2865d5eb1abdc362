// A `ferry serve` peer in its own process, for tests that cross a process
// boundary. The peer exposes engine-allocated (memfd) memory and heap memory.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"

namespace ferry::test {

struct Peer {
  std::unique_ptr<Subprocess> proc;
  std::string segment;
  uint64_t epoch = 0;
  uint64_t alloc_addr = 0, alloc_len = 0;
  uint64_t heap_addr = 0, heap_len = 0;
  uint64_t gpu_addr = 0, gpu_len = 0;
  uint16_t port() const;
};

// A socket listening on 127.0.0.1 at a free port, which goes to `port`; -1
// when it cannot be had. For fake peers.
int ListenOnLoopback(uint16_t* port);

// A fake peer on `lfd`: accepts one connection, reads a request's header,
// answers with `payload` as a descriptor, and closes the connection.
std::thread AnswerOneDescriptorFetch(int lfd, std::vector<uint8_t> payload);

// The `ferry` binary: FERRY_BIN from the environment (binaries carried to
// another machine), else the one built beside this test.
std::string FerryBin();

// Runs `ferry bench transfer` with `args` and --json: its JSON line, once
// the command has exited 0.
Result<nlohmann::json> RunBench(std::vector<std::string> args);

// The events that processes run with FERRY_TRACE_FILE=`dir`/NAME wrote
// (common/event_trace.h): every file's, in time order.
struct TraceEvent {
  long long ns;
  unsigned stage;
  uint64_t key;
};
std::vector<TraceEvent> ReadTrace(const std::string& dir);

// The CPUs each of this process's threads named `name` may run on.
std::vector<std::vector<int>> CpusOfThreadsNamed(const std::string& name);

// RunBench over tcp, 1 MiB x 4 for 0.2 s, then `args`, with
// FERRY_TRACE_FILE set: its JSON line, and in `events` what its processes
// logged.
Result<nlohmann::json> RunTracedBench(std::vector<std::string> args,
                                      std::vector<TraceEvent>* events);

// Starts a peer; `port` 0 picks one. `extra` args go to `ferry serve`.
Result<Peer> StartPeer(uint64_t alloc_bytes, uint64_t heap_bytes, uint16_t port = 0,
                       uint64_t gpu_bytes = 0, int gpu_device = 0,
                       const std::vector<std::string>& extra = {});

// Deterministic pseudo-random bytes.
void FillRandom(void* p, size_t n, uint64_t seed);

}  // namespace ferry::test
