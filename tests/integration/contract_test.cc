// The codes and guarantees that include/ferry/engine.h documents, each
// checked, so the header cannot drift from the code. Codes covered elsewhere:
// RegisterMemory, UnregisterMemory's NotFound, OpenSegment's
// InvalidArgument, Unavailable and malformed ProtocolError, and Submit's
// whole-batch codes (bad_input_test.cc); per-request OutOfRange, Timeout,
// ConnectionLost and PeerRestarted (engine_test.cc, bad_input_test.cc).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/cpu_claim.h"
#include "common/cpu_quota.h"
#include "ferry/engine.h"
#include "gpu/gpu.h"
#include "integration/peer.h"
#include "integration/silent_target.h"
#include "integration/thread_in_quota.h"
#include "transfer/frame_wire.h"
#include "transfer/tcp/lane.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

StatusCode CreateFails(EngineOptions o) {
  auto e = Engine::Create(std::move(o));
  return e.ok() ? StatusCode::kOk : e.status().code();
}

TEST(EngineContract, CreateRefusesWhatItCannotServe) {
  for (const char* bad : {"bogus", "local", "cuda_ipc"}) {
    EngineOptions o;
    o.transport = bad;  // unknown, or not one that can be forced
    EXPECT_EQ(CreateFails(o), StatusCode::kInvalidArgument) << bad;
  }
  for (const char* fine : {"", "auto", "tcp", "shm"}) {
    EngineOptions o;
    o.transport = fine;
    EXPECT_EQ(CreateFails(o), StatusCode::kOk) << fine;
  }
  EngineOptions lanes;
  lanes.tcp_lanes = -1;
  EXPECT_EQ(CreateFails(lanes), StatusCode::kInvalidArgument);
  EngineOptions gpu_lanes;
  gpu_lanes.tcp_gpu_lanes = 0;
  EXPECT_EQ(CreateFails(gpu_lanes), StatusCode::kInvalidArgument);
  for (int buffers : {-1, 4097}) {
    EngineOptions staging;
    staging.tcp_staging_buffers = buffers;
    EXPECT_EQ(CreateFails(staging), StatusCode::kInvalidArgument) << buffers;
  }
  for (uint64_t bytes : {uint64_t{4095}, uint64_t{64 << 20} + 1}) {
    EngineOptions chunks;
    chunks.tcp_gpu_chunk_bytes = bytes;
    EXPECT_EQ(CreateFails(chunks), StatusCode::kInvalidArgument) << bytes;
  }
  EngineOptions host;
  host.host = "not-an-address";
  EXPECT_EQ(CreateFails(host), StatusCode::kInvalidArgument);
  EngineOptions metadata;
  metadata.metadata = "zookeeper://127.0.0.1:2181/c";
  EXPECT_EQ(CreateFails(metadata), StatusCode::kNotSupported);
  metadata.metadata = "etcd://127.0.0.1:2379";  // no cluster (etcd_engine_test has more)
  EXPECT_EQ(CreateFails(metadata), StatusCode::kInvalidArgument);
  EngineOptions taken;
  const int busy = test::ListenOnLoopback(&taken.port);
  ASSERT_GE(busy, 0);
  EXPECT_EQ(CreateFails(taken), StatusCode::kUnavailable) << "port " << taken.port;
  close(busy);
}

TEST(EngineContract, CreateRefusesAMalformedEnvironmentVariable) {
  for (const char* name :
       {"FERRY_TCP_LANES", "FERRY_MAX_CONNECTIONS", "FERRY_MAX_CONNECTIONS_PER_SOURCE",
        "FERRY_STAGING_WRITEBACK", "FERRY_LOG_LEVEL", "FERRY_IO_SHARED", "FERRY_TCP_GPU_LANES",
        "FERRY_IO_SPIN_US", "FERRY_IO_CPUS", "FERRY_TCP_STAGING_BUFFERS",
        "FERRY_TCP_GPU_CHUNK_BYTES", "FERRY_HELPER_CPUS"}) {
    setenv(name, "abc", 1);
    auto e = Engine::Create({});
    unsetenv(name);
    ASSERT_FALSE(e.ok()) << name;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(e.status().message().find(name), std::string::npos) << e.status().ToString();
    EXPECT_NE(e.status().message().find("'abc'"), std::string::npos) << e.status().ToString();
  }
  setenv("FERRY_TCP_LANES", "2", 1);  // a well-formed value still applies
  EXPECT_EQ(CreateFails({}), StatusCode::kOk);
  setenv("FERRY_TCP_LANES", "0", 1);  // the default: 8, 4 or 2 by the cores
  EXPECT_EQ(CreateFails({}), StatusCode::kOk);
  setenv("FERRY_TCP_LANES", "-1", 1);
  EXPECT_EQ(CreateFails({}), StatusCode::kInvalidArgument);
  unsetenv("FERRY_TCP_LANES");
  for (const char* spin : {"-2", "10001"}) {
    setenv("FERRY_IO_SPIN_US", spin, 1);
    auto e = Engine::Create({});
    unsetenv("FERRY_IO_SPIN_US");  // before any assertion can return
    ASSERT_FALSE(e.ok()) << spin;
    EXPECT_NE(e.status().message().find("FERRY_IO_SPIN_US"), std::string::npos)
        << e.status().ToString();
  }
  setenv("FERRY_IO_SPIN_US", "0", 1);  // sleeping at once still moves bytes: see below
  EXPECT_EQ(CreateFails({}), StatusCode::kOk);
  unsetenv("FERRY_IO_SPIN_US");
}

// The default polls where the io threads leave most cores free, and sleeps
// at once where they take half of them or more (below 4 cores: more than
// half); a value set is kept.
TEST(EngineContract, IoPollingDefaultFollowsTheThreadsPerCore) {
  EXPECT_EQ(EffectiveIoSpinUs(-1, 4, 16), 50);
  EXPECT_EQ(EffectiveIoSpinUs(-1, 7, 16), 50);
  EXPECT_EQ(EffectiveIoSpinUs(-1, 8, 16), 0);
  EXPECT_EQ(EffectiveIoSpinUs(-1, 8, 128), 50);  // 8 lanes on a large host
  EXPECT_EQ(EffectiveIoSpinUs(-1, 64, 128), 0);
  EXPECT_EQ(EffectiveIoSpinUs(-1, 2, 2), 0);   // the 2-core VM: a thread per core
  EXPECT_EQ(EffectiveIoSpinUs(-1, 1, 2), 50);  // one thread, as set by hand, still polls
  EXPECT_EQ(EffectiveIoSpinUs(-1, 2, 3), 0);
  EXPECT_EQ(EffectiveIoSpinUs(-1, 1, 3), 50);
  EXPECT_EQ(EffectiveIoSpinUs(-1, 2, 4), 0);
  EXPECT_EQ(EffectiveIoSpinUs(0, 1, 2), 0);
  EXPECT_EQ(EffectiveIoSpinUs(200, 8, 16), 200);
  setenv("FERRY_IO_SPIN_US", "-1", 1);  // the default, spelled out
  EXPECT_EQ(CreateFails({}), StatusCode::kOk);
  unsetenv("FERRY_IO_SPIN_US");
}

// 8 lanes from 16 cores, 4 from 4, 2 below; one io thread per 2 cores, up
// to the lanes, and one per core below 4 cores: a lane per io thread there.
TEST(EngineContract, LanesAndIoThreadsDefaultFollowTheCores) {
  EXPECT_EQ(EffectiveTcpLanes(0, 2), 2);  // the 2-core VM
  EXPECT_EQ(EffectiveTcpLanes(0, 3), 2);
  EXPECT_EQ(EffectiveTcpLanes(0, 4), 4);
  EXPECT_EQ(EffectiveTcpLanes(0, 15), 4);
  EXPECT_EQ(EffectiveTcpLanes(0, 16), 8);  // the H200 machine
  EXPECT_EQ(EffectiveTcpLanes(3, 2), 3);   // a value set is kept
  EXPECT_EQ(EffectiveTcpLanes(0), EffectiveTcpLanes(0, cpus::Parallel()));
  EXPECT_EQ(DefaultIoThreads(2, EffectiveTcpLanes(0, 2)), 2);
  EXPECT_EQ(DefaultIoThreads(3, EffectiveTcpLanes(0, 3)), 2);
  EXPECT_EQ(DefaultIoThreads(1, 4), 1);
  EXPECT_EQ(DefaultIoThreads(2, 4), 2);  // the 2-core VM
  EXPECT_EQ(DefaultIoThreads(3, 4), 3);
  EXPECT_EQ(DefaultIoThreads(2, 1), 1);  // never more than the lanes
  EXPECT_EQ(DefaultIoThreads(4, 4), 2);
  EXPECT_EQ(DefaultIoThreads(16, 8), 8);  // the H200 machine
  EXPECT_EQ(DefaultIoThreads(16, 4), 4);
  EXPECT_EQ(DefaultIoThreads(128, 8), 8);
}

// The CPUs each of this process's io threads may run on, once `n` of them
// run (they name themselves then), or after 2 s with fewer.
std::vector<std::vector<int>> IoThreadsOnceRunning(size_t n) {
  std::vector<std::vector<int>> sets;
  for (int tries = 0; tries < 400 && sets.size() < n; ++tries) {
    if (tries > 0) std::this_thread::sleep_for(milliseconds(5));
    sets = test::CpusOfThreadsNamed("ferry-io");
  }
  return sets;
}

// The defaults count the CPUs this process may use, not the host's: an
// engine made where the affinity allows one CPU starts the io threads of
// one core (taskset -c 0, or a container's cpuset, does the same).
TEST(EngineContract, DefaultsCountTheCpusTheProcessMayUse) {
  const std::vector<int> allowed = cpus::Allowed();
  ASSERT_FALSE(allowed.empty());
  ASSERT_EQ(cpus::Parallel(), static_cast<int>(allowed.size()));
  {
    EngineOptions o;
    o.transport = "tcp";
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const int want = DefaultIoThreads(cpus::Parallel(), EffectiveTcpLanes(0));
    EXPECT_EQ(e.value()->options().io_threads, want);
    EXPECT_EQ(IoThreadsOnceRunning(want).size(), static_cast<size_t>(want));
  }
  struct Restore {
    cpu_set_t all;
    ~Restore() { sched_setaffinity(0, sizeof(all), &all); }
  } restore;
  ASSERT_EQ(sched_getaffinity(0, sizeof(restore.all), &restore.all), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(allowed.front(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // this thread, and those it starts
  EXPECT_EQ(cpus::Parallel(), 1);
  EngineOptions o;
  o.transport = "tcp";
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value()->options().tcp_lanes, 2);
  EXPECT_EQ(e.value()->options().io_threads, 1);
  EXPECT_EQ(e.value()->options().io_spin_us, 0);
  ASSERT_EQ(IoThreadsOnceRunning(1).size(), 1u);
  std::this_thread::sleep_for(milliseconds(100));  // time for a second to show
  EXPECT_EQ(IoThreadsOnceRunning(1).size(), 1u);
}

// A CPU quota (docker --cpus, a Kubernetes limit) leaves threads free to
// run on every CPU the affinity allows, so lanes and io threads stay as
// they were; it stops polling, which spends the CPU time a quota limits.
TEST(EngineContract, ACpuQuotaStopsPollingButNotThreads) {
  const int parallel = cpus::Parallel();
  EngineOptions one;
  one.transport = "tcp";
  one.io_threads = 1;  // one io thread polls where the CPUs are to spare
  {
    auto e = Engine::Create(one);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e.value()->options().io_spin_us, parallel >= 2 ? 50 : 0);
  }
  // On a thread other than the process's first, whose cgroup the quota's
  // thread does not share.
  std::string skip;
  std::thread([&] {
    ThreadInQuota quota("50000");  // half a CPU a 100 ms period
    if (!quota.joined()) {
      skip = quota.why();
      return;
    }
    EXPECT_EQ(cpus::Budget(), 1);
    EXPECT_EQ(cpus::Parallel(), parallel);
    auto e = Engine::Create(one);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e.value()->options().io_spin_us, 0);
    EngineOptions defaults;
    defaults.transport = "tcp";
    auto d = Engine::Create(defaults);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d.value()->options().tcp_lanes, EffectiveTcpLanes(0, parallel));
    EXPECT_EQ(d.value()->options().io_threads,
              DefaultIoThreads(parallel, EffectiveTcpLanes(0, parallel)));
  }).join();
  if (!skip.empty()) GTEST_SKIP() << "needs a writable cgroup v1 cpu controller: " << skip;
}

// io_cpus as a list: each io thread runs only on its CPU of it, and bytes
// still move.
TEST(EngineContract, IoThreadsRunOnTheCpusListed) {
  const std::vector<int> allowed = cpus::Allowed();
  ASSERT_FALSE(allowed.empty());
  const int cpu = allowed.back();
  EngineOptions o;
  o.transport = "tcp";
  o.io_threads = 2;
  o.io_cpus = std::to_string(cpu);
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  int pinned = 0;
  for (const std::vector<int>& set : IoThreadsOnceRunning(2)) {
    if (set == std::vector<int>{cpu}) ++pinned;
  }
  EXPECT_EQ(pinned, 2) << "io threads on CPU " << cpu << " alone";
  auto mem = e.value()->AllocateMemory(1 << 20);
  ASSERT_TRUE(mem.ok());
  auto seg = e.value()->OpenSegment(e.value()->name());
  ASSERT_TRUE(seg.ok());
  std::vector<char> src(1 << 20, 5);
  ASSERT_TRUE(e.value()
                  ->Transfer({Op::kWrite, src.data(), seg.value(),
                              reinterpret_cast<uint64_t>(mem.value()), src.size()})
                  .ok());
  EXPECT_EQ(std::memcmp(mem.value(), src.data(), src.size()), 0);
}

// Each io thread polling its own sockets (the default) and all of them on
// one io_context (io_shared) move the same bytes, with several threads;
// so do threads that sleep at once instead of polling first (io_spin_us 0).
TEST(EngineContract, BothIoModelsMoveBytesOverTcp) {
  struct Mode {
    bool shared;
    int spin_us;
  };
  for (Mode m : {Mode{false, 50}, Mode{true, 50}, Mode{false, 0}, Mode{true, 0}}) {
    EngineOptions o;
    o.transport = "tcp";
    o.io_threads = 3;
    o.io_shared = m.shared;
    o.io_spin_us = m.spin_us;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const size_t n = 3 << 20;
    auto mem = e.value()->AllocateMemory(n);
    ASSERT_TRUE(mem.ok());
    auto seg = e.value()->OpenSegment(e.value()->name());
    ASSERT_TRUE(seg.ok());
    std::vector<char> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<char>(i * 7 + m.shared + m.spin_us);
    ASSERT_TRUE(e.value()
                    ->Transfer({Op::kWrite, src.data(), seg.value(),
                                reinterpret_cast<uint64_t>(mem.value()), n})
                    .ok());
    EXPECT_EQ(std::memcmp(mem.value(), src.data(), n), 0)
        << "shared " << m.shared << ", spin " << m.spin_us;
  }
}

TEST(EngineContract, AllocatedAndRegisteredMemoryGoTheirOwnWays) {
  auto e = Engine::Create({}).value();
  EXPECT_EQ(e->AllocateMemory(0).status().code(), StatusCode::kInvalidArgument);
  auto mem = e->AllocateMemory(1 << 16);
  ASSERT_TRUE(mem.ok());
  std::vector<char> heap(1 << 16);
  ASSERT_TRUE(e->RegisterMemory(heap.data(), heap.size()).ok());
  EXPECT_EQ(e->UnregisterMemory(mem.value()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->FreeMemory(heap.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->FreeMemory(static_cast<char*>(mem.value()) + 1).code(), StatusCode::kNotFound);
  // The refusals left both in place.
  auto seg = e->OpenSegment(e->name());
  ASSERT_TRUE(seg.ok());
  char c = 'x';
  EXPECT_TRUE(
      e->Transfer({Op::kWrite, &c, seg.value(), reinterpret_cast<uint64_t>(mem.value()), 1}).ok());
  EXPECT_TRUE(
      e->Transfer({Op::kWrite, &c, seg.value(), reinterpret_cast<uint64_t>(heap.data()), 1}).ok());
  ASSERT_TRUE(e->FreeMemory(mem.value()).ok());
  EXPECT_EQ(e->FreeMemory(mem.value()).code(), StatusCode::kNotFound);
  ASSERT_TRUE(e->UnregisterMemory(heap.data()).ok());
  // Withdrawn: later requests fail with OutOfRange.
  EXPECT_EQ(
      e->Transfer({Op::kWrite, &c, seg.value(), reinterpret_cast<uint64_t>(heap.data()), 1}).code(),
      StatusCode::kOutOfRange);
}

TEST(EngineContract, OpenSegmentTimesOutOnAPeerThatNeverAnswers) {
  uint16_t port = 0;
  int lfd = test::ListenOnLoopback(&port);  // the kernel accepts; nobody answers
  ASSERT_GE(lfd, 0);
  EngineOptions o;
  o.connect_timeout = milliseconds(200);
  auto e = Engine::Create(o).value();
  auto s = e->OpenSegment("127.0.0.1:" + std::to_string(port));
  close(lfd);
  EXPECT_EQ(s.status().code(), StatusCode::kTimeout) << s.status().ToString();
}

// A listener that answers GetDescriptor with a descriptor of format 3, the one
// before per-transport blobs: an old peer is refused by name.
TEST(EngineContract, OpenSegmentRefusesAnotherDescriptorFormat) {
  uint16_t port = 0;
  int lfd = test::ListenOnLoopback(&port);
  ASSERT_GE(lfd, 0);
  std::vector<uint8_t> old;
  ByteWriter w(&old);
  w.U32(0x33534446);  // "FDS3"
  w.U64(7);
  std::thread fake = test::AnswerOneDescriptorFetch(lfd, std::move(old));
  auto e = Engine::Create({}).value();
  auto s = e->OpenSegment("127.0.0.1:" + std::to_string(port));
  fake.join();
  close(lfd);
  EXPECT_EQ(s.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(s.status().message().find("format 3"), std::string::npos) << s.status().ToString();
}

// Requests a peer never answers: Wait times out while the batch goes on,
// Result shows them running, and CloseSegment fails them with Cancelled.
TEST(EngineContract, CloseSegmentCancelsHeldRequestsAndForgetsTheSegment) {
  test::SilentTarget target;
  EngineOptions o;
  o.transport = "tcp";
  auto e = Engine::Create(o).value();
  auto s = e->OpenSegment(target.name());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<char> buf(4 * 4096);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(
        {Op::kRead, buf.data() + i * 4096, s.value(), test::SilentTarget::kHost + i * 4096, 4096});
  }
  auto b = e->Submit(reqs, seconds(60));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value()->Wait(milliseconds(50)).code(), StatusCode::kTimeout);
  EXPECT_FALSE(b.value()->Poll().done()) << "a timed-out Wait leaves the batch running";
  EXPECT_FALSE(b.value()->Result(0).done);
  const RequestResult past = b.value()->Result(reqs.size());
  EXPECT_TRUE(past.done);
  EXPECT_EQ(past.status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(past.transport, kNoTransport);

  ASSERT_TRUE(e->CloseSegment(s.value()).ok());
  EXPECT_EQ(b.value()->Wait(seconds(10)).code(), StatusCode::kCancelled);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(b.value()->Result(i).status.code(), StatusCode::kCancelled) << i;
    EXPECT_EQ(b.value()->Result(i).transport, "tcp") << i;
  }
  EXPECT_EQ(e->Submit(reqs).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e->CloseSegment(s.value()).code(), StatusCode::kNotFound);
  EXPECT_EQ(e->GetSegmentInfo(s.value()).status().code(), StatusCode::kNotFound);
}

// A request that fails before a transport is chosen names none.
TEST(EngineContract, ARequestRefusedBeforeRoutingNamesNoTransport) {
  auto e = Engine::Create({}).value();
  auto mem = e->AllocateMemory(4096);
  ASSERT_TRUE(mem.ok());
  auto s = e->OpenSegment(e->name());
  ASSERT_TRUE(s.ok());
  char c[16];
  auto b = e->Submit(std::vector<Request>{{Op::kRead, c, s.value(), 0x10, sizeof(c)}});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value()->Wait(seconds(10)).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.value()->Result(0).transport, kNoTransport);
}

// Freeing a batch whose reads are on the wire, unanswered, waits until no
// engine thread can write into its buffers: the transport releases them at
// their deadline. (Without that wait, a late reply would land in freed memory.)
TEST(EngineContract, FreeingABatchWaitsForItsRequestsDeadline) {
  test::SilentTarget target;
  EngineOptions o;
  o.transport = "tcp";
  auto e = Engine::Create(o).value();
  auto s = e->OpenSegment(target.name());
  ASSERT_TRUE(s.ok());
  std::vector<char> buf(4096);
  const Millis deadline(300);
  const auto t0 = Clock::now();
  auto b = e->Submit(std::vector<Request>{{Op::kRead, buf.data(), s.value(),
                                           test::SilentTarget::kHost, buf.size()}},
                     deadline);
  ASSERT_TRUE(b.ok());
  for (int i = 0; i < 1000 && target.requests() < 1; ++i) std::this_thread::sleep_for(Millis(5));
  ASSERT_EQ(target.requests(), 1) << "the read never reached the wire";
  b.value().reset();
  EXPECT_GE(Clock::now() - t0, deadline) << "returned while the read was still held";
  // The engine goes on serving.
  auto mem = e->AllocateMemory(4096);
  ASSERT_TRUE(mem.ok());
}

TEST(EngineContract, SubmitOnStreamNeedsAGpu) {
  if (gpu::DeviceCount() > 0) GTEST_SKIP() << "a GPU is present: tests/gpu covers the stream path";
  auto e = Engine::Create({}).value();
  auto mem = e->AllocateMemory(4096);
  ASSERT_TRUE(mem.ok());
  auto s = e->OpenSegment(e->name());
  ASSERT_TRUE(s.ok());
  char c[16];
  auto b = e->SubmitOnStream(
      std::vector<Request>{{Op::kWrite, c, s.value(), reinterpret_cast<uint64_t>(mem.value()), 16}},
      nullptr);
  EXPECT_EQ(b.status().code(), StatusCode::kNotSupported) << b.status().ToString();
}

// How many of `requests` reads of `chunk` bytes at `remote` an engine of
// `o` sends a SilentTarget, which answers none: what its lanes' windows hold.
// Waits for `want`, then a little longer for any more.
int SentUnanswered(EngineOptions o, uint64_t remote, uint64_t chunk, int requests, int want) {
  test::SilentTarget target;
  o.transport = "tcp";
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return -1;
  auto s = e.value()->OpenSegment(target.name());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return -1;
  std::vector<char> buf(requests * chunk);
  std::vector<Request> reqs;
  for (int i = 0; i < requests; ++i) {
    reqs.push_back({Op::kRead, buf.data() + i * chunk, s.value(), remote + i * chunk, chunk});
  }
  auto b = e.value()->Submit(reqs, seconds(30));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  for (int i = 0; i < 500 && target.requests() < want; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  std::this_thread::sleep_for(milliseconds(200));  // no more should follow
  const int sent = target.requests();
  e.value().reset();  // fails the unanswered requests, so the batch ends now
  return sent;
}

// A request to the target's GPU memory waits there for a copy to staging, so
// a lane lets twice its window of them on the wire; small chunks of host
// memory get up to a megabyte's worth (16 at most) on a lane of its own
// queue, on a shared one half a lane's share of the batch from 256 KiB to
// 512 KiB (here 3 MiB on one lane: 512 KiB); large ones the window.
TEST(TcpLanes, TheWindowGrowsForGpuMemoryAndForSmallChunks) {
  struct Case {
    uint64_t remote;
    uint64_t length;
    int want;
  };
  // CI forces FERRY_TCP_SHARED_QUEUE in one pass.
  const bool shared = ChunkQueue::Shared(1);
  for (Case c : {Case{test::SilentTarget::kHost, 4096, 16}, Case{test::SilentTarget::kGpu, 4096, 4},
                 Case{test::SilentTarget::kHost, 128 << 10, shared ? 4 : 8},
                 Case{test::SilentTarget::kHost, 512 << 10, 2}}) {
    EngineOptions o;
    o.tcp_lanes = 1;
    o.tcp_chunks_in_flight = 2;
    EXPECT_EQ(SentUnanswered(o, c.remote, c.length, 24, c.want), c.want)
        << "remote 0x" << std::hex << c.remote << std::dec << ", chunks of " << c.length;
  }
}

// A write's on_sent runs once its payload is on the socket, before any
// reply: a staged write gives its buffer back then, a round trip before the
// ack (FERRY_TCP_EARLY_RELEASE). Closing the lane still fails the write.
TEST(TcpLanes, AWriteIsSeenSentBeforeItsReply) {
  test::SilentTarget target;
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&io] { io.run(); });
  Lane::Config cfg;
  cfg.peer = asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), target.port());
  cfg.peer_name = target.name();
  auto queue = std::make_shared<ChunkQueue>();
  auto lane = std::make_shared<Lane>(io, cfg, std::weak_ptr<Segment>(), queue);
  std::vector<char> payload(256 << 10, 'w');
  std::atomic<int> sent{0}, done{0};
  Task t;
  t.op = Op::kWrite;
  t.local = payload.data();
  t.remote = test::SilentTarget::kHost;
  t.length = payload.size();
  t.deadline = Deadline::After(seconds(30));
  t.batch = std::make_shared<BatchState>(1);
  t.on_done = std::make_shared<std::function<void(const Status&)>>([&](const Status&) { ++done; });
  t.on_sent = std::make_shared<std::function<void()>>([&] { ++sent; });
  queue->Push({t});
  lane->Kick();
  for (int i = 0; i < 1000 && (sent == 0 || target.writes() == 0); ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(sent.load(), 1);
  EXPECT_EQ(target.writes(), 1);
  EXPECT_EQ(done.load(), 0);  // no reply came
  lane->Close();
  for (int i = 0; i < 1000 && done == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(done.load(), 1);
  EXPECT_EQ(sent.load(), 1);
  io.stop();
  runner.join();
}

// Unset, the windows follow the queue: where a peer's lanes share one (more
// than one io thread), 2 chunks a lane, or small ones in two rounds of a
// lane's share of the batch (256 to 512 KiB); where each has its own, 4, or
// 1 MiB.
TEST(TcpLanes, TheDefaultWindowIsNarrowWhereLanesShareAQueue) {
  struct Case {
    int io_threads;
    uint64_t chunk;
    int requests;
  };
  for (Case c : {Case{1, 512 << 10, 48}, Case{2, 512 << 10, 48}, Case{1, 64 << 10, 48},
                 Case{2, 64 << 10, 48}, Case{2, 64 << 10, 16}}) {
    const bool shared = ChunkQueue::Shared(static_cast<size_t>(c.io_threads));
    // A lane's share of 48 x 64 KiB is 1.5 MiB (window 512 KiB), of 16 512 KiB (256 KiB).
    const int small = c.requests == 48 ? 8 : 4;
    const int per_lane = c.chunk == 512 << 10 ? (shared ? 2 : 4) : (shared ? small : 16);
    const int want = 2 * per_lane;  // of 2 lanes
    EngineOptions o;
    o.tcp_lanes = 2;
    o.io_threads = c.io_threads;
    EXPECT_EQ(SentUnanswered(o, test::SilentTarget::kHost, c.chunk, c.requests, want), want)
        << c.io_threads << " io threads" << (shared ? ", a shared queue" : "") << ", " << c.requests
        << " chunks of " << c.chunk;
  }
  if (std::getenv("FERRY_TCP_SHARED_QUEUE") == nullptr) {
    EXPECT_FALSE(ChunkQueue::Shared(1));
    EXPECT_TRUE(ChunkQueue::Shared(2));
  }
  EXPECT_EQ(Lane::ChunksInFlight(3, true), 3);
  EXPECT_EQ(Lane::ChunksInFlight(3, false), 3);
  EXPECT_EQ(Lane::GpuWindow(0), 8);
  EXPECT_EQ(Lane::GpuWindow(2), 4);
  EXPECT_EQ(Lane::SmallWindowBytes(512, true), 512u << 10);
}

}  // namespace
}  // namespace ferry
