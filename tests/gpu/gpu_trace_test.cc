// The staged paths of GPU memory over tcp, traced (FERRY_TRACE_FILE,
// common/event_trace.h): a chunk's stages at both ends, a read's payload
// before its landing, and each copy's enqueue with its size. Without a GPU
// each test reports itself skipped.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "common/event_trace.h"
#include "gpu/skip.h"
#include "integration/peer.h"

namespace ferry {
namespace {

// FERRY_TRACE_FILE over GPU memory at both ends of tcp: each staged chunk's
// copy is seen done, and at the target each chunk is announced, received,
// written back, copied to the device and acked; that copy is also timed on
// the GPU, its end no earlier than its start and no later than its being
// seen done.
TEST(Gpu, TracesTheStagedPathOfGpuMemoryOverTcp) {
  SKIP_WITHOUT_GPU();
  std::vector<test::TraceEvent> events;
  auto j = test::RunTracedBench({"--op", "write", "--gpu-src", "0", "--gpu-dst", "0"}, &events);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  std::map<unsigned, int> n;
  for (const auto& e : events) ++n[e.stage];
  EXPECT_GT(n[trace::kStaged], 0);
  for (auto stage : {trace::kStagedCopyDone, trace::kSend, trace::kReply, trace::kTargetHeader,
                     trace::kTargetPayload, trace::kLandStart, trace::kLandWrittenBack,
                     trace::kLandCopyDone, trace::kTargetAck}) {
    EXPECT_EQ(n[stage], n[trace::kStaged]) << "stage " << stage;
  }
  EXPECT_EQ(n[trace::kGpuCopyInStart], n[trace::kStaged]);
  EXPECT_EQ(n[trace::kGpuCopyInEnd], n[trace::kStaged]);
  std::map<uint64_t, long long> start, end;
  for (const auto& e : events) {
    if (e.stage == trace::kGpuCopyInStart) start[e.key] = e.ns;
    if (e.stage == trace::kGpuCopyInEnd) end[e.key] = e.ns;
    if (e.stage == trace::kLandCopyDone && end.count(e.key) > 0) {
      // The anchor between the clocks is good to a few us either way.
      EXPECT_LE(end[e.key], e.ns + 100'000) << "a copy seen done before it ended on the GPU";
    }
  }
  for (const auto& [key, ns] : end) EXPECT_LE(start[key], ns);
}

// A read into GPU memory over tcp, traced: each chunk's payload is seen in
// its staging buffer at the initiator once, and no later than its landing
// starts (both keyed by the chunk's device address).
TEST(Gpu, TracesAStagedReadsPayloadBeforeItsLanding) {
  SKIP_WITHOUT_GPU();
  std::vector<test::TraceEvent> events;
  auto j = test::RunTracedBench({"--op", "read", "--gpu-dst", "0"}, &events);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  std::map<unsigned, int> n;
  for (const auto& e : events) ++n[e.stage];
  EXPECT_GT(n[trace::kStagedReadIn], 0);
  EXPECT_EQ(n[trace::kStagedReadIn], n[trace::kLandStart]);
  // A chunk's address comes round again batch after batch: each landing
  // takes the payload last seen in at its address, in time order.
  std::map<uint64_t, long long> in;
  for (const auto& e : events) {
    if (e.stage == trace::kStagedReadIn) in[e.key] = e.ns;
    if (e.stage == trace::kLandStart) {
      EXPECT_EQ(in.erase(e.key), 1u) << "a landing with no payload seen in before it";
    }
  }
}

// A read into GPU memory landing in 256 KiB pieces, traced: each 1 MiB
// chunk's payload is seen in, then its copies seen done, and it took four
// enqueues of 256 KiB, each within a lane's hand-on of its piece; the lane
// marks each read's payload in; the hand-staged streams of the same run mark
// their own enqueues, of whole 1 MiB blocks.
TEST(Gpu, TracesEachCopysEnqueueWithItsSize) {
  SKIP_WITHOUT_GPU();
  setenv("FERRY_READ_PIECE_KIB", "256", 1);
  std::vector<test::TraceEvent> events;
  auto j = test::RunTracedBench({"--op", "read", "--gpu-dst", "0"}, &events);
  unsetenv("FERRY_READ_PIECE_KIB");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  std::map<std::pair<unsigned, uint64_t>, int> enqueues;  // (stage, KiB)
  std::map<uint64_t, int> in;                             // payloads in, not yet seen landed
  int reads = 0, payloads = 0;
  for (const auto& e : events) {
    if (e.stage == trace::kReadPayloadIn) ++payloads;
    if (e.stage == trace::kCopyEnqueued || e.stage == trace::kRefCopyEnqueued ||
        e.stage == trace::kPieceHandedOn) {
      ++enqueues[std::make_pair(e.stage, e.key >> 32)];
    } else if (e.stage == trace::kStagedReadIn) {
      ++in[e.key];
      ++reads;
    } else if (e.stage == trace::kLandCopyDone) {
      EXPECT_GT(in[e.key]--, 0) << "a piecewise read seen landed before its payload was in";
    }
  }
  ASSERT_GT(reads, 0);
  auto count = [&](unsigned stage, uint64_t kib) { return enqueues[std::make_pair(stage, kib)]; };
  EXPECT_EQ(count(trace::kCopyEnqueued, 256), 4 * reads);
  EXPECT_EQ(count(trace::kCopyEnqueued, 1024), 0);
  EXPECT_EQ(count(trace::kPieceHandedOn, 256), 4 * reads);
  EXPECT_EQ(payloads, reads);
  EXPECT_GT(count(trace::kRefCopyEnqueued, 1024), 0);
}

}  // namespace
}  // namespace ferry
