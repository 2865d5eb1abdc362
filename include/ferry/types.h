// The transfer engine's value types: requests and what a batch reports about
// them. Shared by the engine's facade (engine.h) and its internals, which
// include this header rather than the facade.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

enum class Op : uint8_t { kRead = 0, kWrite = 1 };

// A peer's segment as opened by one engine (Engine::OpenSegment); never 0.
using SegmentId = uint64_t;

struct Request {
  Op op = Op::kRead;
  void* local = nullptr;  // memory of this process, host or GPU; need not be registered
  SegmentId segment = 0;  // from Engine::OpenSegment
  uint64_t remote = 0;    // virtual address inside the target's registered memory
  uint64_t length = 0;    // bytes, > 0
  // The target's epoch (SegmentInfo::epoch) that `remote` belongs to; 0: any.
  // Checked after the submit's descriptor refresh: a target of another epoch
  // (restarted) fails the request with PeerRestarted, and no byte moves.
  uint64_t expected_epoch = 0;
};

// A registered buffer of a segment, as Engine::GetSegmentInfo lists it.
struct BufferInfo {
  uint64_t addr = 0;
  uint64_t length = 0;
  bool memfd = false;  // engine-allocated: same-host peers map it and memcpy
};

struct SegmentInfo {
  std::string name;
  uint64_t epoch = 0;  // changes when the peer process restarts
  bool same_host = false;
  std::vector<BufferInfo> buffers;  // sorted by address
};

// A batch's progress, as Batch::Poll sees it.
struct BatchStatus {
  size_t total = 0;
  size_t succeeded = 0;
  size_t failed = 0;
  Status first_error;  // OK unless failed > 0
  bool done() const { return succeeded + failed == total; }
};

// The transport name a request reports before one was chosen for it.
inline constexpr std::string_view kNoTransport = "none";

// One request of a batch, as Batch::Result sees it.
struct RequestResult {
  bool done = false;
  Status status;  // meaningful once done
  // The registered name of the transport that moved the request, as listed
  // in src/transfer/*/ (tests and benchmarks check it); kNoTransport when it
  // failed before one was chosen. Points at static storage.
  std::string_view transport = kNoTransport;
};

}  // namespace ferry
