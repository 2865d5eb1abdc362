// A fault-injecting transport, for tests only: "fault_tcp" wraps tcp the way
// LevelDB's SpecialEnv wraps Env. It registers itself in the test binary
// (FERRY_REGISTER_TRANSPORT), so the conformance suite, parametrized over
// every registered transport, runs through it; an engine uses it only when
// it forces it (EngineOptions::transport), for its priority is below every
// real one. Nothing of it is in the library.
//
// Its endpoint is tcp's own, connected through a proxy on loopback that
// reads the frame headers (frame_wire.h) and forwards to the peer's
// listener, and that sits between the engine and tcp's endpoint. With no
// fault armed it passes everything through. Faults, armed on the
// FaultInjector and spent as they hit:
// - kDelay: tasks are held before tcp gets them, for `delay` or until
//   ReleaseHeld; a task whose deadline passes meanwhile fails with Timeout,
//   at its deadline.
// - kFail: tasks complete with `code` at once, never reaching tcp.
// - kDrop: the proxy forwards half of a frame's payload (a Write's, or a
//   ReadData's for op kRead), then closes the initiator's connection and
//   ends its send side towards the target, whose close it then sees.
// - kCorrupt: the proxy flips one byte in the middle of such a payload.
//
// Every task given to a fault_tcp endpoint is counted, and so is its
// completion; a second completion of a task is counted and not forwarded.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "transfer/frame_wire.h"

namespace ferry::test {

inline constexpr char kFaultTransport[] = "fault_tcp";

enum class FaultKind { kDelay, kFail, kDrop, kCorrupt };

// kDelay: held until FaultInjector::ReleaseHeld (or the task's deadline).
inline constexpr Millis kUntilReleased = Millis::max();

struct Fault {
  FaultKind kind = FaultKind::kFail;
  Op op = Op::kWrite;  // the tasks it hits; for kDrop and kCorrupt, Write or ReadData frames
  int count = 1;       // how many it hits before it is spent
  Millis delay{0};     // kDelay
  StatusCode code = StatusCode::kUnavailable;  // kFail
};

// The process's faults and counts, shared by every fault_tcp transport.
// Thread-safe.
class FaultInjector {
 public:
  static FaultInjector& Get();

  void Arm(const Fault& fault);
  // Disarms every fault and zeroes the counts; held tasks are released.
  void Reset();
  // Releases every task a kDelay holds now.
  void ReleaseHeld();

  struct Counts {
    uint64_t posted = 0;           // tasks given to fault_tcp endpoints
    uint64_t completed = 0;        // of them, completed (once)
    uint64_t completed_twice = 0;  // completions after the first: never forwarded
    uint64_t held = 0;             // tasks a kDelay holds now
    uint64_t hits = 0;             // tasks and frames a fault hit
    uint64_t accepted = 0;         // connections the proxies accepted
    // Connections a kDrop ended that the target then closed itself.
    uint64_t target_closed = 0;
    // The last frame a kDrop or kCorrupt hit: its address and payload length,
    // and the payload offset where it was cut or its byte flipped.
    uint64_t frame_addr = 0, frame_length = 0, frame_at = 0;
  };
  Counts counts() const;

  // ---- for the transport ----

  // The fault to apply to a task of `op` about to be posted, if one is armed.
  std::optional<Fault> TakeTaskFault(Op op);
  // The same for a frame the proxy read the header of; `to_target` is its
  // direction. Sets `*at` to the payload offset where it applies.
  std::optional<Fault> TakeFrameFault(bool to_target, const wire::Header& h, uint64_t* at);
  uint64_t release_round() const;
  void Count(uint64_t Counts::*field, int64_t delta = 1);

 private:
  std::optional<Fault> Take(Op op, bool frame);

  mutable std::mutex mu_;
  std::vector<Fault> armed_;    // guarded by mu_
  Counts counts_;               // guarded by mu_
  uint64_t release_round_ = 0;  // guarded by mu_; bumped by ReleaseHeld and Reset
};

}  // namespace ferry::test
