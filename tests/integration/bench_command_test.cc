// `ferry bench transfer` end to end: its target and initiator processes,
// what it reports, and the settings each side is given.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cpu_claim.h"
#include "common/cpu_quota.h"
#include "common/event_trace.h"
#include "ferry/engine.h"
#include "integration/peer.h"

namespace ferry {
namespace {

void RunBench(std::vector<std::string> args, nlohmann::json* j) {
  auto r = test::RunBench(std::move(args));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  *j = std::move(r).value();
}

// `ferry bench transfer` end to end: a target and an initiator process, the
// engine's figure, and the raw reference with one TCP stream per engine lane.
TEST(BenchCommand, ReportsTheEngineAgainstRawStreamsOfTheSameParallelism) {
  nlohmann::json j;
  ASSERT_NO_FATAL_FAILURE(RunBench({"--transport", "tcp", "--op", "read", "--block-size", "65536",
                                    "--batch-size", "4", "--duration", "0.3"},
                                   &j));
  EXPECT_EQ(j["transport"], "tcp");
  EXPECT_GT(j["gbps"].get<double>(), 0);
  EXPECT_EQ(j["reference"], "tcp_streams");
  EXPECT_EQ(j["reference_streams"].get<int>(), EffectiveTcpLanes(EngineOptions{}.tcp_lanes));
  EXPECT_GT(j["reference_gbps"].get<double>(), 0) << "the raw streams failed";
  // The same streams confirming each batch ran too, a read's shares asked for.
  EXPECT_GT(j["reference_batched_gbps"].get<double>(), 0) << "the batched raw streams failed";
  EXPECT_NEAR(j["ratio_batched"].get<double>(),
              j["gbps"].get<double>() / j["reference_batched_gbps"].get<double>(), 1e-9);
  // Bytes across two CPUs, before and after, where there are two to use.
  if (cpus::Allowed().size() >= 2) {
    ASSERT_TRUE(j.contains("cross_cpu_gbps"));
    ASSERT_EQ(j["cross_cpu_gbps"].size(), 2u);
    EXPECT_GT(j["cross_cpu_gbps"][0].get<double>(), 0);
    EXPECT_GT(j["cross_cpu_gbps"][1].get<double>(), 0);
  } else {
    EXPECT_FALSE(j.contains("cross_cpu_gbps"));
  }
  // Writes, with the streams over the batch's bytes: each end sets up its
  // buffer and says so before the timing starts.
  nlohmann::json w;
  ASSERT_NO_FATAL_FAILURE(RunBench({"--transport", "tcp", "--op", "write", "--block-size", "65536",
                                    "--batch-size", "8", "--duration", "0.3", "--ref-spread"},
                                   &w));
  EXPECT_TRUE(w["reference_spread"].get<bool>());
  EXPECT_GT(w["reference_gbps"].get<double>(), 0) << "the raw streams failed";
  EXPECT_GT(w["reference_batched_gbps"].get<double>(), 0) << "a write's shares went unconfirmed";
  // Two submitting threads, whose batches overlap: against the same
  // unbroken streams, and not against streams confirming each batch.
  nlohmann::json t;
  ASSERT_NO_FATAL_FAILURE(RunBench({"--transport", "tcp", "--op", "write", "--block-size", "65536",
                                    "--batch-size", "8", "--duration", "0.3", "--threads", "2"},
                                   &t));
  EXPECT_EQ(t["threads"].get<int>(), 2);
  EXPECT_GT(t["gbps"].get<double>(), 0);
  EXPECT_GT(t["reference_gbps"].get<double>(), 0) << "the raw streams failed";
  EXPECT_FALSE(t.contains("reference_batched_gbps"));
}

// --fresh: single passes over target memory set up just before each, for
// shm (engine-allocated) and tcp (registered anonymous memory), reported
// beside the steady figure and against the same reference.
TEST(BenchCommand, FreshPassesAreTimedOverNewTargetMemory) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    nlohmann::json j;
    ASSERT_NO_FATAL_FAILURE(RunBench({"--transport", transport, "--block-size", "1MiB",
                                      "--batch-size", "4", "--duration", "0.2", "--fresh", "3"},
                                     &j));
    EXPECT_EQ(j["transport"], transport);
    EXPECT_EQ(j["fresh_runs"].get<int>(), 3);
    EXPECT_EQ(j["fresh_gbps_all"].size(), 3u);
    EXPECT_GT(j["fresh_gbps"].get<double>(), 0);
    EXPECT_GT(j["fresh_ratio"].get<double>(), 0);
  }
}

// FERRY_TRACE_FILE: each process of the bench writes its events when it
// exits. Between a batch's submit and its waiter's return, its events show
// its tasks posted once, and each of its chunks put into a send, announced,
// received and acked at the target, its ack sent, and the chunk answered;
// nothing of another batch. Every send is seen completed (its completion may
// run after the reply, so at any time).
TEST(BenchCommand, TracesEveryChunkOfEachBatchWhereAsked) {
  std::vector<test::TraceEvent> events;
  auto j = test::RunTracedBench({"--op", "write"}, &events);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_FALSE(events.empty()) << "no process wrote its events";
  size_t batches = 0;
  std::map<unsigned, int> in_batch, all;
  bool open = false;
  for (const test::TraceEvent& e : events) {
    ++all[e.stage];
    // A lane woken for work that others took may look after the batch is done.
    if (e.stage == trace::kSent || e.stage == trace::kKicked) continue;
    if (e.stage == trace::kSubmit) {
      EXPECT_FALSE(open) << "a submit before the last batch's waiter returned";
      open = true;
      in_batch.clear();
    } else if (e.stage == trace::kWaitDone) {
      ASSERT_TRUE(open);
      open = false;
      ++batches;
      EXPECT_GE(in_batch[trace::kSend], 4) << "batch " << batches;
      EXPECT_EQ(in_batch[trace::kPost], 1) << "batch " << batches;
      for (auto stage : {trace::kReply, trace::kTargetHeader, trace::kTargetPayload,
                         trace::kTargetAck, trace::kTargetReplyOut}) {
        EXPECT_EQ(in_batch[stage], in_batch[trace::kSend])
            << "batch " << batches << " stage " << stage;
      }
    } else {
      EXPECT_TRUE(open) << "stage " << e.stage << " outside a batch";
      ++in_batch[e.stage];
    }
  }
  EXPECT_GT(batches, 2u);
  EXPECT_EQ(all[trace::kSent], all[trace::kSend]);
}

// A traced read marks its payload all in once its reply has come: as many
// payloads in as replies, each after its own reply (same key), so reply to
// payload-in is the receive's time (scripts/trace-batches).
TEST(BenchCommand, TracesEachReadsPayloadInAfterItsReply) {
  std::vector<test::TraceEvent> events;
  auto j = test::RunTracedBench({"--op", "read"}, &events);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  std::map<uint64_t, int> replied;  // by key: replies not yet matched by a payload in
  int replies = 0, payloads = 0;
  for (const test::TraceEvent& e : events) {
    if (e.stage == trace::kReply) {
      ++replied[e.key];
      ++replies;
    } else if (e.stage == trace::kReadPayloadIn) {
      EXPECT_GT(replied[e.key]--, 0) << "a payload in with no reply before it";
      ++payloads;
    }
  }
  EXPECT_GT(replies, 8);
  EXPECT_EQ(payloads, replies);
}

// --target-env and --initiator-env: each setting reaches its own side's
// process alone, and one that side refuses fails the bench.
TEST(BenchCommand, EachSidesSettingsReachThatSideAlone) {
  const std::vector<std::string> base = {"--transport",  "tcp", "--block-size", "65536",
                                         "--batch-size", "4",   "--duration",   "0.2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return extra;
  };
  nlohmann::json j;
  ASSERT_NO_FATAL_FAILURE(
      RunBench(with({"--initiator-env", "FERRY_IO_THREADS=1", "--initiator-env",
                     "FERRY_IO_SPIN_US=7", "--target-env", "FERRY_IO_SPIN_US=200"}),
               &j));
  EXPECT_EQ(j["io_threads"].get<int>(), 1);
  EXPECT_EQ(j["io_spin_us"].get<int>(), 7) << "the target's value reached the initiator";
  EXPECT_EQ(j["target_env"], nlohmann::json::array({"FERRY_IO_SPIN_US=200"}));
  EXPECT_EQ(j["initiator_env"].size(), 2u);
  // The target's io threads are not the initiator's.
  const int usual = DefaultIoThreads(cpus::Parallel(), EffectiveTcpLanes(0));
  if (usual != 1) {
    ASSERT_NO_FATAL_FAILURE(RunBench(with({"--target-env", "FERRY_IO_THREADS=1"}), &j));
    EXPECT_EQ(j["io_threads"].get<int>(), usual);
  }
  // A value one side refuses stops that side, and the bench fails.
  EXPECT_FALSE(test::RunBench(with({"--target-env", "FERRY_IO_SPIN_US=bogus"})).ok());
  EXPECT_FALSE(test::RunBench(with({"--initiator-env", "FERRY_TCP_LANES=bogus"})).ok());
  EXPECT_FALSE(test::RunBench(with({"--target-env", "NO_VALUE"})).ok());
}

}  // namespace
}  // namespace ferry
