// Where a batch's time goes: timestamped events along a chunk's path
// (docs/performance.md, "Against raw streams that stage GPU memory by
// hand"). Off unless FERRY_TRACE_FILE is set when the process starts; then
// each Mark appends {steady clock ns, stage, key} to a buffer of 4 Mi events
// (later ones are dropped), written as text lines "ns stage key(hex)" to
// $FERRY_TRACE_FILE.<pid> when the process exits normally. Processes on one
// host share the clock, so a bench's two processes line up;
// scripts/trace-batches reads the files. Off, FERRY_TRACE costs a branch;
// on, the process touches the whole buffer (96 MiB) when it starts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ferry::trace {

// A chunk's key is the remote address it moves (the target sees the same);
// batch events have key 0.
enum Stage : uint32_t {
  kSubmit = 0,          // a batch is submitted
  kStaged = 1,          // initiator: a chunk of GPU memory has its staging buffer
  kStagedCopyDone = 2,  // initiator: its device-to-host copy is seen done
  kSend = 3,            // initiator: a chunk goes into a lane's send
  kSent = 4,            // initiator: that send has completed
  kReply = 5,           // initiator: a chunk's ack or read data arrives
  kWaitDone = 6,        // a batch's waiter returns
  kPost = 7,            // the submitter hands a batch's tasks to an endpoint (key 0)
  kKicked = 8,          // a lane's kick runs on its io thread (key 0)
  kTargetHeader = 10,   // target: a write or read is announced
  kTargetPayload = 11,  // target: a write's payload is in (memory, or staging for a GPU)
  kLandStart = 12,      // a landing job starts (key: the device address)
  kLandWrittenBack = 13,
  kLandCopyDone = 14,    // its host-to-device copy is seen done
  kTargetAck = 15,       // target: the reply (a write's ack, a read's bytes) is queued
  kTargetReplyOut = 16,  // target: that reply goes into a send
  kStageAsked = 17,      // initiator: a chunk of GPU memory asks for a staging buffer
  kStagedEnqueued = 18,  // initiator: its device-to-host copy is enqueued
  // A copy into GPU memory (key: its destination) begins and ends on the
  // GPU: times the GPU's events gave, put on the steady clock by an anchor
  // event the copier timed when it was made (a few us either way).
  kGpuCopyInStart = 19,
  kGpuCopyInEnd = 20,
  // The copier's completion thread (key: a span in ns, marked at its end):
  // away between two looks with copies pending, in one look's CUDA
  // queries, in one look's done callbacks. Only spans over 30 us.
  kCopierAway = 21,
  kCopierQueries = 22,
  kCopierCallbacks = 23,
  // Initiator: a staged read's payload is in its staging buffer, before
  // the hand-off to land it (key: the device address, as kLandStart's).
  kStagedReadIn = 24,
  // How long one cudaMemcpyAsync took to enqueue, marked at its end (key:
  // the copy's KiB << 32 | its ns): the copier's (kCopyEnqueued), and the
  // hand-staged reference streams' (kRefCopyEnqueued), to set one against
  // the other.
  kCopyEnqueued = 25,
  kRefCopyEnqueued = 26,
  // Initiator: a read's payload is all in (key: the remote address, as
  // kReply's), any read, so that reply to payload-in is its receive's time.
  kReadPayloadIn = 27,
  // How long a lane's hand-on of one piece of a read (Task::on_piece) took
  // on the socket thread, the copy's enqueue within it (key as kCopyEnqueued's).
  kPieceHandedOn = 28,
};

namespace detail {
extern bool on;  // set once, at static initialization
}  // namespace detail

inline bool On() { return detail::on; }
void Mark(Stage stage, uint64_t key);
// A mark at a time taken earlier, or elsewhere: steady clock ns (NowNs).
void MarkAt(Stage stage, uint64_t key, int64_t ns);
int64_t NowNs();

// Traced runs: a span of work on `bytes`, for as long as the timer lives,
// marked as `stage` at its end (key: KiB << 32 | ns). Untraced, a branch.
class SizedSpan {
 public:
  SizedSpan(Stage stage, size_t bytes)
      : stage_(stage), kib_(bytes >> 10), at_(On() ? NowNs() : 0) {}
  ~SizedSpan() {
    if (at_ == 0) return;
    const int64_t now = NowNs();
    const auto ns = std::min<uint64_t>(static_cast<uint64_t>(now - at_), 0xffffffffu);
    MarkAt(stage_, kib_ << 32 | ns, now);
  }
  SizedSpan(const SizedSpan&) = delete;
  SizedSpan& operator=(const SizedSpan&) = delete;

 private:
  const Stage stage_;
  const uint64_t kib_;
  const int64_t at_;
};

// Marks only when tracing is on.
#define FERRY_TRACE(stage, key)                                                        \
  do {                                                                                 \
    if (::ferry::trace::On()) ::ferry::trace::Mark(stage, static_cast<uint64_t>(key)); \
  } while (0)

}  // namespace ferry::trace
