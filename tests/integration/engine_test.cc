// Conformance suite of the transfer engine, run over every registered
// transport: against a peer in another process, or, for a transport that
// reaches only this process, against the engine itself. A transport is
// skipped by its capabilities (one that moves no host memory, or is not
// available here), never by its name.
#include "ferry/engine.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include <asio.hpp>

#include "common/fd_passing.h"
#include "common/subprocess.h"
#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "integration/peer.h"
#include "transfer/io_pool.h"
#include "transfer/memory_registry.h"
#include "transfer/metadata.h"
#include "transfer/peer_memfd.h"
#include "transfer/transport.h"
#include "integration/silent_target.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kAlloc = 160ull << 20;
constexpr uint64_t kHeap = 8ull << 20;

// Every registered transport's name, sorted.
std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
  for (const auto& r : RegisteredTransports()) names.emplace_back(r.name);
  std::sort(names.begin(), names.end());
  return names;
}

// A transport's capabilities in this process, read from one made on a bare
// context, with a GPU copier where this process has a GPU.
TransportCaps CapsOf(const std::string& name) {
  EngineOptions options;
  IoPool io;
  io.Create(1, false);
  ThreadPool pool(1, "ferry-test");
  MemoryRegistry registry;
  auto copier = gpu::Copier::Create();
  EngineContext ctx{options, io, pool, registry, copier.ok() ? copier.value().get() : nullptr};
  for (const auto& r : RegisteredTransports()) {
    if (name == r.name) return r.factory(ctx)->caps();
  }
  return {};
}

class EngineConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const TransportCaps caps = CapsOf(GetParam());
    if (!caps.available) GTEST_SKIP() << GetParam() << " is not available in this process";
    if (!caps.host_memory) {
      GTEST_SKIP() << GetParam() << " moves GPU memory only: ferry_gpu_tests covers it";
    }
    // One that reaches only this process serves the engine's own segment
    // unforced; any other is forced, against a peer process.
    const bool in_process = caps.reach == Reach::kProcess;
    EngineOptions o;
    o.transport = in_process ? "" : GetParam();
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    if (in_process) {
      auto a = engine_->AllocateMemory(kAlloc);
      ASSERT_TRUE(a.ok());
      alloc_ = reinterpret_cast<uint64_t>(a.value());
      heap_mem_.resize(kHeap);
      heap_ = reinterpret_cast<uint64_t>(heap_mem_.data());
      ASSERT_TRUE(engine_->RegisterMemory(heap_mem_.data(), kHeap).ok());
      name_ = engine_->name();
    } else {
      auto p = test::StartPeer(kAlloc, kHeap);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      peer_ = std::move(p).value();
      alloc_ = peer_.alloc_addr;
      heap_ = peer_.heap_addr;
      name_ = peer_.segment;
    }
    auto s = engine_->OpenSegment(name_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    seg_ = s.value();
  }

  // Writes `n` random bytes from an unaligned local buffer to `remote`, reads
  // them back into another, and checks every byte and the serving transport.
  void RoundTrip(uint64_t remote, size_t n, uint64_t seed) {
    std::vector<char> src(n + 3), dst(n + 5, 0);
    char* s = src.data() + 3;
    char* d = dst.data() + 5;
    test::FillRandom(s, n, seed);
    Request w{Op::kWrite, s, seg_, remote, n};
    auto b = engine_->Submit(std::span<const Request>(&w, 1));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE(b.value()->Wait(seconds(60)).ok()) << b.value()->Poll().first_error.ToString();
    EXPECT_EQ(b.value()->Result(0).transport, GetParam());
    Request r{Op::kRead, d, seg_, remote, n};
    ASSERT_TRUE(engine_->Transfer(r).ok());
    ASSERT_EQ(0, std::memcmp(s, d, n)) << "size " << n << " at +" << (remote - alloc_);
  }

  std::unique_ptr<Engine> engine_;
  test::Peer peer_;
  std::vector<char> heap_mem_;
  std::string name_;
  SegmentId seg_ = 0;
  uint64_t alloc_ = 0, heap_ = 0;
};

TEST_P(EngineConformance, SizesFromOneByteTo64MiBAtUnalignedOffsets) {
  uint64_t seed = 1;
  for (size_t n : {size_t{1}, size_t{7}, size_t{4095}, size_t{4096}, size_t{65537},
                   size_t{(1 << 20) + 3}, size_t{(8 << 20) - 1}, size_t{64 << 20}}) {
    RoundTrip(alloc_ + 1 + (seed * 4099) % 4096, n, seed);
    ++seed;
  }
}

TEST_P(EngineConformance, HeapMemoryRoundTrip) {
  // Not memfd-backed: shm falls back to process_vm_readv/writev.
  for (size_t n : {size_t{1}, size_t{3000}, size_t{(1 << 20) + 17}}) RoundTrip(heap_ + 13, n, n);
}

TEST_P(EngineConformance, BatchesFromOneTo1024) {
  for (size_t batch : {size_t{1}, size_t{2}, size_t{17}, size_t{256}, size_t{1024}}) {
    const size_t block = 1001;  // odd, so every request is unaligned
    std::vector<char> src(batch * block), dst(batch * block, 0);
    test::FillRandom(src.data(), src.size(), batch);
    std::vector<Request> w, r;
    for (size_t i = 0; i < batch; ++i) {
      uint64_t remote = alloc_ + 5 + i * block;
      w.push_back({Op::kWrite, src.data() + i * block, seg_, remote, block});
      r.push_back({Op::kRead, dst.data() + i * block, seg_, remote, block});
    }
    auto wb = engine_->Submit(w);
    ASSERT_TRUE(wb.ok());
    ASSERT_TRUE(wb.value()->Wait(seconds(60)).ok()) << wb.value()->Poll().first_error.ToString();
    BatchStatus st = wb.value()->Poll();
    EXPECT_EQ(st.succeeded, batch);
    EXPECT_EQ(st.failed, 0u);
    auto rb = engine_->Submit(r);
    ASSERT_TRUE(rb.ok());
    ASSERT_TRUE(rb.value()->Wait(seconds(60)).ok());
    for (size_t i = 0; i < batch; ++i) {
      ASSERT_TRUE(rb.value()->Result(i).done);
      ASSERT_EQ(rb.value()->Result(i).transport, GetParam());
    }
    ASSERT_EQ(0, std::memcmp(src.data(), dst.data(), src.size())) << "batch " << batch;
  }
}

TEST_P(EngineConformance, SeveralSubmittingThreads) {
  constexpr int kThreads = 4;
  const uint64_t region = kAlloc / kThreads;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 100);
      for (int iter = 0; iter < 30; ++iter) {
        size_t n = 1 + rng() % (2 << 20);
        uint64_t off = rng() % (region - n);
        uint64_t remote = alloc_ + static_cast<uint64_t>(t) * region + off;
        std::vector<char> src(n), dst(n);
        test::FillRandom(src.data(), n, rng());
        Request w{Op::kWrite, src.data(), seg_, remote, n};
        Request r{Op::kRead, dst.data(), seg_, remote, n};
        if (!engine_->Transfer(w).ok() || !engine_->Transfer(r).ok() ||
            std::memcmp(src.data(), dst.data(), n) != 0) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(EngineConformance, FreeingABatchInFlightCancelsAndReturns) {
  std::vector<char> buf(16 << 20);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back({Op::kRead, buf.data() + (i % 8) * (2 << 20), seg_,
                    alloc_ + static_cast<uint64_t>(i) * (16 << 20), 2 << 20});
  }
  for (int round = 0; round < 20; ++round) {
    auto b = engine_->Submit(reqs);
    ASSERT_TRUE(b.ok());
    b.value().reset();  // must return, with no engine thread still writing into buf
  }
  std::memset(buf.data(), 0x5a, buf.size());
  std::this_thread::sleep_for(milliseconds(50));
  for (char c : buf) ASSERT_EQ(c, 0x5a);
  RoundTrip(alloc_ + 11, 1 << 20, 42);  // the engine still serves
}

TEST_P(EngineConformance, OutOfRangeRemoteFailsThatRequestOnly) {
  // Disjoint buffers and ranges: the requests of a batch run concurrently.
  std::vector<char> buf(4 * 4096);
  uint64_t end = alloc_ + kAlloc;
  std::vector<Request> reqs = {
      {Op::kWrite, buf.data(), seg_, alloc_ + 100, 4096},
      {Op::kWrite, buf.data() + 4096, seg_, end - 100, 4096},  // crosses the end
      {Op::kRead, buf.data() + 8192, seg_, 4096, 4096},        // never registered
      {Op::kRead, buf.data() + 12288, seg_, alloc_ + 8192, 4096},
  };
  auto b = engine_->Submit(reqs);
  ASSERT_TRUE(b.ok());
  Status st = b.value()->Wait(seconds(30));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_TRUE(b.value()->Result(0).status.ok());
  EXPECT_EQ(b.value()->Result(1).status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.value()->Result(2).status.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(b.value()->Result(3).status.ok());
  EXPECT_EQ(b.value()->Poll().failed, 2u);
  RoundTrip(alloc_ + 1, 10000, 3);  // still serving
}

TEST_P(EngineConformance, PartlyOutOfRangeWriteChangesNothing) {
  // R7: a request that runs past its buffer fails whole, before any byte
  // moves, even where tcp slices it into chunks that the target checks alone.
  const uint64_t in_range = 1 << 20;
  const uint64_t start = alloc_ + kAlloc - in_range;
  std::vector<char> before(in_range, 0x11);
  ASSERT_TRUE(engine_->Transfer({Op::kWrite, before.data(), seg_, start, in_range}).ok());
  std::vector<char> big(4 * in_range, 0x22);
  Status st = engine_->Transfer({Op::kWrite, big.data(), seg_, start, big.size()});
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  std::vector<char> after(in_range, 0);
  ASSERT_TRUE(engine_->Transfer({Op::kRead, after.data(), seg_, start, in_range}).ok());
  EXPECT_TRUE(after == before) << "the in-range part was written";
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineConformance, ::testing::ValuesIn(TransportNames()),
                         [](const auto& info) { return info.param; });

// ---- registration changes at the target ----

TEST(Registrations, UnregisteredMemoryIsRefusedAndNewMemoryIsReached) {
  // The target is a second engine in this process, so the test can change its
  // registrations; shm reaches it by process_vm, tcp through its listener.
  for (std::string transport : {"", "tcp"}) {
    SCOPED_TRACE("transport '" + transport + "'");
    auto target = Engine::Create({}).value();
    EngineOptions o;
    o.transport = transport;
    auto engine = Engine::Create(o).value();
    std::vector<char> old_buf(1 << 20, 0), new_buf(1 << 20, 0), data(4096, 0x44);
    ASSERT_TRUE(target->RegisterMemory(old_buf.data(), old_buf.size()).ok());
    auto seg = engine->OpenSegment(target->name());
    ASSERT_TRUE(seg.ok());
    const uint64_t old_addr = reinterpret_cast<uint64_t>(old_buf.data());
    ASSERT_TRUE(engine->Transfer({Op::kWrite, data.data(), seg.value(), old_addr, 4096}).ok());
    EXPECT_EQ(old_buf[0], 0x44);

    // Unregistered: refused before a byte moves, though the memory still exists.
    ASSERT_TRUE(target->UnregisterMemory(old_buf.data()).ok());
    std::fill(old_buf.begin(), old_buf.end(), 0x33);
    Status st = engine->Transfer({Op::kWrite, data.data(), seg.value(), old_addr, 4096});
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
    EXPECT_EQ(std::count(old_buf.begin(), old_buf.end(), 0x33), static_cast<long>(old_buf.size()));

    // Registered after the segment was opened: reached, by every transport.
    ASSERT_TRUE(target->RegisterMemory(new_buf.data(), new_buf.size()).ok());
    const uint64_t new_addr = reinterpret_cast<uint64_t>(new_buf.data());
    auto b = engine->Submit(
        std::vector<Request>{{Op::kWrite, data.data(), seg.value(), new_addr, 4096}});
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b.value()->Wait(seconds(10)).ok());
    EXPECT_EQ(b.value()->Result(0).transport, transport == "tcp" ? "tcp" : "shm");
    EXPECT_EQ(new_buf[4095], 0x44);
  }
}

// The engine's watch follows a same-host peer's registrations with no submit:
// the cached descriptor, which GetSegmentInfo shows without refetching, gains
// a buffer registered after the segment was opened and loses one removed.
TEST(Registrations, TheWatchFollowsSameHostPeersWithoutASubmit) {
  auto target = Engine::Create({}).value();
  auto engine = Engine::Create({}).value();
  std::vector<char> a(1 << 16), b(1 << 16);
  ASSERT_TRUE(target->RegisterMemory(a.data(), a.size()).ok());
  auto seg = engine->OpenSegment(target->name());
  ASSERT_TRUE(seg.ok());
  auto shows = [&](const std::vector<char>& buf) {
    auto info = engine->GetSegmentInfo(seg.value());
    if (!info.ok()) return false;
    return std::any_of(
        info.value().buffers.begin(), info.value().buffers.end(),
        [&](const BufferInfo& i) { return i.addr == reinterpret_cast<uint64_t>(buf.data()); });
  };
  auto within = [](auto&& cond) {
    for (int i = 0; i < 400 && !cond(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return cond();
  };
  EXPECT_FALSE(shows(b));
  ASSERT_TRUE(target->RegisterMemory(b.data(), b.size()).ok());
  EXPECT_TRUE(within([&] { return shows(b); }));
  ASSERT_TRUE(target->UnregisterMemory(a.data()).ok());
  EXPECT_TRUE(within([&] { return !shows(a); }));
}

// A peer that registers and unregisters without pause keeps its segment
// outdated most of the time. Submits to its stable buffer still succeed:
// they wait for a round of the watch, not for a quiet moment (peers.cc,
// RefreshIfChanged), which would end in a timeout. On two cores the churn has
// pauses, so this does not reliably fail without that bound; it guards
// against churn making requests fail or lose data.
TEST(Registrations, SubmitsToAPeerThatKeepsRegisteringSucceed) {
  auto target = Engine::Create({}).value();
  auto engine = Engine::Create({}).value();
  std::vector<char> stable(1 << 16, 0), churn(4096), data(4096, 0x5c);
  ASSERT_TRUE(target->RegisterMemory(stable.data(), stable.size()).ok());
  auto seg = engine->OpenSegment(target->name());
  ASSERT_TRUE(seg.ok());
  std::atomic<bool> stop{false};
  std::thread churner([&] {
    while (!stop.load()) {
      (void)target->RegisterMemory(churn.data(), churn.size());
      (void)target->UnregisterMemory(churn.data());
    }
  });
  const uint64_t addr = reinterpret_cast<uint64_t>(stable.data());
  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    Status st = engine->Transfer({Op::kWrite, data.data(), seg.value(), addr, 4096}, seconds(10));
    EXPECT_TRUE(st.ok()) << st.ToString();
    ok += st.ok() ? 1 : 0;
  }
  stop = true;
  churner.join();
  EXPECT_EQ(ok, 20);
  EXPECT_EQ(stable[4095], 0x5c);
}

// ---- the bench command ----

// `ferry bench transfer` end to end: a target and an initiator process, the
// engine's figure, and the raw reference with one TCP stream per engine lane.
TEST(BenchCommand, ReportsTheEngineAgainstRawStreamsOfTheSameParallelism) {
  auto p = Subprocess::Spawn(
      {test::FerryBin(), "bench", "transfer", "--transport", "tcp", "--op", "read", "--block-size",
       "65536", "--batch-size", "4", "--duration", "0.3", "--json"},
      true);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  nlohmann::json j;
  for (int i = 0; i < 10 && j.is_null(); ++i) {
    auto line = p.value()->ReadLine(seconds(60));
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    if (!line.value().empty() && line.value()[0] == '{') j = nlohmann::json::parse(line.value());
  }
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["transport"], "tcp");
  EXPECT_GT(j["gbps"].get<double>(), 0);
  EXPECT_EQ(j["reference"], "tcp_streams");
  EXPECT_EQ(j["reference_streams"].get<int>(), EngineOptions{}.tcp_lanes);
  EXPECT_GT(j["reference_gbps"].get<double>(), 0) << "the raw streams failed";
  auto rc = p.value()->Wait(seconds(30));
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(rc.value(), 0);
}

// ---- transport selection ----

TEST(TransportSelection, SameHostPeersUseShmUnlessTcpIsForced) {
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok());
  for (const char* forced : {"", "env:tcp", "tcp", "auto"}) {
    std::string f = forced;
    EngineOptions o;
    if (f == "env:tcp") {
      setenv("FERRY_TRANSPORT", "tcp", 1);
    } else {
      o.transport = f;
    }
    auto e = Engine::Create(o);
    unsetenv("FERRY_TRANSPORT");
    ASSERT_TRUE(e.ok());
    auto s = e.value()->OpenSegment(peer.value().segment);
    ASSERT_TRUE(s.ok());
    auto info = e.value()->GetSegmentInfo(s.value());
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info.value().same_host);
    char c = 'x';
    Request r{Op::kWrite, &c, s.value(), peer.value().alloc_addr, 1};
    auto b = e.value()->Submit(std::span<const Request>(&r, 1));
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(b.value()->Wait(seconds(10)).ok());
    const char* want = (f == "" || f == "auto") ? "shm" : "tcp";
    EXPECT_EQ(b.value()->Result(0).transport, want) << "forced=" << f;
  }
}

TEST(TransportSelection, OwnSegmentCopiesLocally) {
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  auto mem = e.value()->AllocateMemory(1 << 20);
  ASSERT_TRUE(mem.ok());
  auto s = e.value()->OpenSegment(e.value()->name());
  ASSERT_TRUE(s.ok());
  char src[64] = "loopback", dst[64] = {};
  Request w{Op::kWrite, src, s.value(), reinterpret_cast<uint64_t>(mem.value()) + 9, 64};
  auto b = e.value()->Submit(std::span<const Request>(&w, 1));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b.value()->Wait(seconds(5)).ok());
  EXPECT_EQ(b.value()->Result(0).transport, "local");
  EXPECT_EQ(0, std::memcmp(static_cast<char*>(mem.value()) + 9, "loopback", 9));
  Request r{Op::kRead, dst, s.value(), reinterpret_cast<uint64_t>(mem.value()) + 9, 64};
  ASSERT_TRUE(e.value()->Transfer(r).ok());
  EXPECT_STREQ(dst, "loopback");
}

// A request to the target's GPU memory waits there for a copy to staging, so
// a lane lets twice its window of them on the wire; host memory keeps the
// window.
TEST(TcpLanes, RequestsToGpuMemoryGetTwiceTheWindow) {
  for (uint64_t remote : {test::SilentTarget::kHost, test::SilentTarget::kGpu}) {
    test::SilentTarget target;
    EngineOptions o;
    o.transport = "tcp";
    o.tcp_lanes = 1;
    o.tcp_chunks_in_flight = 2;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    auto s = e.value()->OpenSegment(target.name());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::vector<char> buf(16 * 4096);
    std::vector<Request> reqs;
    for (int i = 0; i < 16; ++i) {
      reqs.push_back({Op::kRead, buf.data() + i * 4096, s.value(), remote + i * 4096, 4096});
    }
    auto b = e.value()->Submit(reqs, seconds(30));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    const int want = remote == test::SilentTarget::kGpu ? 4 : 2;
    for (int i = 0; i < 500 && target.requests() < want; ++i) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    std::this_thread::sleep_for(milliseconds(200));  // no more should follow
    EXPECT_EQ(target.requests(), want) << "remote 0x" << std::hex << remote;
    e.value().reset();  // fails the unanswered requests, so the batch ends now
  }
}

TEST(EngineLifecycle, CreateAndDestroyInALoop) {
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok());
  for (int i = 0; i < 20; ++i) {
    EngineOptions o;
    o.transport = i % 2 ? "tcp" : "shm";
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok());
    auto s = e.value()->OpenSegment(peer.value().segment);
    ASSERT_TRUE(s.ok());
    char c[100] = {};
    ASSERT_TRUE(e.value()->Transfer({Op::kRead, c, s.value(), peer.value().alloc_addr, 100}).ok());
  }
}

TEST(EngineLifecycle, TwoEnginesInOneProcessTalk) {
  auto a = Engine::Create({});
  EngineOptions ot;
  ot.transport = "tcp";
  auto b = Engine::Create(ot);
  ASSERT_TRUE(a.ok() && b.ok());
  auto mem = a.value()->AllocateMemory(4096);
  ASSERT_TRUE(mem.ok());
  auto s = b.value()->OpenSegment(a.value()->name());
  ASSERT_TRUE(s.ok());
  char msg[] = "between engines";
  auto b1 = b.value()->Submit(std::vector<Request>{
      {Op::kWrite, msg, s.value(), reinterpret_cast<uint64_t>(mem.value()), sizeof(msg)}});
  ASSERT_TRUE(b1.ok());
  ASSERT_TRUE(b1.value()->Wait(seconds(5)).ok());
  EXPECT_EQ(b1.value()->Result(0).transport, "tcp");
  EXPECT_STREQ(static_cast<char*>(mem.value()), msg);
}

// ---- a restarted peer ----

// A peer in its own process and an engine of this one, forced to
// `transport`, that has opened the peer's segment.
struct OpenedPeer {
  Result<test::Peer> peer = Status::Internal("not started");
  Result<std::unique_ptr<Engine>> e = Status::Internal("not made");
  Result<SegmentId> s = Status::Internal("not opened");
  uint16_t port = 0;
};
void OpenPeer(const char* transport, OpenedPeer* p) {
  p->peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(p->peer.ok());
  p->port = p->peer.value().port();
  EngineOptions o;
  o.transport = transport;
  p->e = Engine::Create(o);
  ASSERT_TRUE(p->e.ok());
  p->s = p->e.value()->OpenSegment(p->peer.value().segment);
  ASSERT_TRUE(p->s.ok());
}

TEST(PeerRestart, NewEpochIsDetectedAndTheCacheRefreshed) {
  for (const char* transport : {"tcp", "shm"}) {
    OpenedPeer p;
    ASSERT_NO_FATAL_FAILURE(OpenPeer(transport, &p));
    auto& [peer, e, s, port] = p;
    char buf[256] = {};
    Request r{Op::kRead, buf, s.value(), peer.value().alloc_addr, sizeof(buf)};
    ASSERT_TRUE(e.value()->Transfer(r).ok());
    const uint64_t old_epoch = e.value()->GetSegmentInfo(s.value()).value().epoch;

    peer.value().proc.reset();  // SIGKILL
    auto again = test::StartPeer(1 << 20, 0, port);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    ASSERT_NE(again.value().epoch, old_epoch);

    // The old addresses belong to a dead process: the request must fail, not
    // land somewhere in the new one.
    Status st = e.value()->Transfer(r, seconds(10));
    EXPECT_TRUE(st.code() == StatusCode::kPeerRestarted || st.code() == StatusCode::kConnectionLost)
        << transport << ": " << st.ToString();
    auto info = e.value()->GetSegmentInfo(s.value());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info.value().epoch, again.value().epoch) << transport;
    ASSERT_FALSE(info.value().buffers.empty());
    Request r2{Op::kRead, buf, s.value(), info.value().buffers[0].addr, sizeof(buf)};
    EXPECT_TRUE(e.value()->Transfer(r2, seconds(10)).ok()) << transport;
  }
}

// Request::expected_epoch: a request names the epoch its address came
// from, and a target of another epoch fails it with PeerRestarted, whether
// the descriptor is new to this submit or was refreshed inside it.
TEST(PeerRestart, ARequestForAnotherEpochMovesNothing) {
  for (const char* transport : {"tcp", "shm"}) {
    OpenedPeer p;
    ASSERT_NO_FATAL_FAILURE(OpenPeer(transport, &p));
    auto& [peer, e, s, port] = p;
    const uint64_t epoch = e.value()->GetSegmentInfo(s.value()).value().epoch;
    ASSERT_EQ(epoch, peer.value().epoch);
    std::vector<char> out(4096, 'x'), in(4096, 0);
    Request w{Op::kWrite, out.data(), s.value(), peer.value().alloc_addr, out.size()};
    w.expected_epoch = epoch;
    ASSERT_TRUE(e.value()->Transfer(w).ok()) << transport;

    // A live peer of another epoch: refused, and its bytes stay.
    std::vector<char> junk(4096, 'j');
    Request bad{Op::kWrite, junk.data(), s.value(), peer.value().alloc_addr, junk.size()};
    bad.expected_epoch = epoch ^ 1;
    Status st = e.value()->Transfer(bad, seconds(10));
    EXPECT_EQ(st.code(), StatusCode::kPeerRestarted) << transport << ": " << st.ToString();
    Request r{Op::kRead, in.data(), s.value(), peer.value().alloc_addr, in.size()};
    r.expected_epoch = epoch;
    ASSERT_TRUE(e.value()->Transfer(r).ok()) << transport;
    EXPECT_EQ(in, out) << transport << ": a refused write reached the peer";

    // The peer restarts on its port; the request of the old epoch fails for
    // the epoch (not for the range), after the refresh the failure causes,
    // and keeps failing; one of the new epoch is served.
    peer.value().proc.reset();  // SIGKILL
    auto again = test::StartPeer(1 << 20, 0, port);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    for (int i = 0; i < 3; ++i) {
      st = e.value()->Transfer(r, seconds(10));
      EXPECT_TRUE(st.code() == StatusCode::kPeerRestarted ||
                  (i == 0 && st.code() == StatusCode::kConnectionLost))
          << transport << " try " << i << ": " << st.ToString();
    }
    auto info = e.value()->GetSegmentInfo(s.value());
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info.value().epoch, again.value().epoch);
    Request fresh{Op::kRead, in.data(), s.value(), again.value().alloc_addr, in.size()};
    fresh.expected_epoch = info.value().epoch;
    EXPECT_TRUE(e.value()->Transfer(fresh, seconds(10)).ok()) << transport;
  }
}

// ---- same-host peers that forbid tracing (issue 18, point 3) ----

// Drops CAP_SYS_PTRACE from this thread's effective set, so that root traces
// no more than any user does; threads started meanwhile (an engine's)
// inherit that. Restored when it goes. Nothing to drop for other users.
class WithoutTracePrivilege {
 public:
  WithoutTracePrivilege() {
    if (syscall(SYS_capget, &head_, data_) != 0) return;
    saved_ = data_[0].effective;
    data_[0].effective &= ~(1u << CAP_SYS_PTRACE);
    dropped_ = syscall(SYS_capset, &head_, data_) == 0;
  }
  ~WithoutTracePrivilege() {
    if (!dropped_) return;
    data_[0].effective = saved_;
    EXPECT_EQ(syscall(SYS_capset, &head_, data_), 0);
  }

 private:
  __user_cap_header_struct head_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data_[2] = {};
  uint32_t saved_ = 0;
  bool dropped_ = false;
};

// errno of a one-byte process_vm read at address 0 of `pid`: EFAULT once
// the kernel let us in, EPERM when it did not.
int ProcessVmError(pid_t pid) {
  char byte;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) < 0 ? errno : 0;
}

// Writes a pattern into the peer's [addr, addr+n) and reads it back; returns
// the transports that served the two requests.
std::pair<std::string, std::string> RoundTrip(Engine& e, SegmentId s, uint64_t addr, size_t n) {
  std::vector<char> out(n), in(n);
  test::FillRandom(out.data(), n, addr);
  std::string served[2];
  for (int i = 0; i < 2; ++i) {
    Request r{i == 0 ? Op::kWrite : Op::kRead, i == 0 ? out.data() : in.data(), s, addr, n};
    auto b = e.Submit(std::span<const Request>(&r, 1));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return {};
    Status st = b.value()->Wait(seconds(10));
    EXPECT_TRUE(st.ok()) << st.ToString();
    served[i] = b.value()->Result(0).transport;
  }
  EXPECT_TRUE(out == in) << "the bytes read back differ from those written";
  return {served[0], served[1]};
}

// The finding: shm reached a peer by opening /proc/<pid>/fd, and every
// engine called PR_SET_PTRACER_ANY so that it could. A hardened peer (not
// dumpable) closes /proc/<pid>/fd and process_vm to the processes of its own
// uid; it is still served over shm, its memfds passed over a socket.
TEST(SameHostHardening, ANonDumpablePeerIsServedOverShm) {
  auto peer = test::StartPeer(1 << 20, 0, 0, 0, 0, {"--non-dumpable"});
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  WithoutTracePrivilege untraced;
  ASSERT_EQ(ProcessVmError(peer.value().proc->pid()), EPERM) << "the peer can be traced";
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok());
  auto served = RoundTrip(*e.value(), s.value(), peer.value().alloc_addr + 7, 256 << 10);
  EXPECT_EQ(served.first, "shm");
  EXPECT_EQ(served.second, "shm");
}

// Memory that is not a memfd is reachable only through process_vm, which the
// hardened peer refuses: that segment goes over tcp, whole (routing is per
// segment), and stays correct.
TEST(SameHostHardening, HeapMemoryOfANonDumpablePeerSendsItOverTcp) {
  auto peer = test::StartPeer(1 << 20, 1 << 20, 0, 0, 0, {"--non-dumpable"});
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  WithoutTracePrivilege untraced;
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok());
  for (uint64_t addr : {peer.value().heap_addr, peer.value().alloc_addr}) {
    auto served = RoundTrip(*e.value(), s.value(), addr, 64 << 10);
    EXPECT_EQ(served.first, "tcp");
    EXPECT_EQ(served.second, "tcp");
  }
}

// The shm blob of a segment's descriptor: where its memfd server listens.
MemfdServerAddress MemfdServerOf(const std::string& segment) {
  auto addr = ParseSegmentName(segment);
  EXPECT_TRUE(addr.ok());
  auto d = FetchDescriptor(addr.value(), Millis(5000));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  auto at = d.ok() ? DecodeMemfdServer(d.value().SegmentBlobOf("shm")) : std::nullopt;
  EXPECT_TRUE(at.has_value()) << "no memfd server in " << segment << "'s descriptor";
  return at.value_or(MemfdServerAddress{});
}

// A connected socket to the memfd server at `at`, or -1.
int DialMemfdServer(const MemfdServerAddress& at) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, at.name.data(), at.name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + at.name.size());
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads what the server sends until it closes `sock` (true), or `wait`
// passes (false). The bytes go to `*got`, any fds passed are closed and counted.
bool ClosedBy(int sock, Millis wait, std::string* got = nullptr, int* fds = nullptr) {
  const Deadline deadline = Deadline::After(wait);
  for (;;) {
    pollfd p{sock, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::chrono::ceil<Millis>(deadline.Remaining()).count())) <= 0) {
      return false;
    }
    char buf[64];
    std::vector<int> passed;
    const ssize_t n = ReceiveWithFds(sock, buf, sizeof(buf), &passed);
    for (int fd : passed) close(fd);
    if (fds != nullptr) *fds += static_cast<int>(passed.size());
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) return true;
    if (got != nullptr) got->append(buf, static_cast<size_t>(n));
  }
}

// Real and effective uid `uid` for every thread of this process (glibc sets
// them all), so the kernel checks that uid (process_vm looks at the real one)
// and threads started meanwhile have it. The saved 0 lets it back.
class AsAnotherUid {
 public:
  explicit AsAnotherUid(uid_t uid) : ok_(setresuid(uid, uid, 0) == 0) {}
  ~AsAnotherUid() {
    if (!ok_) return;
    EXPECT_EQ(setresuid(0, 0, 0), 0);
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);  // changing uids made this process non-dumpable
  }
  bool ok() const { return ok_; }

 private:
  const bool ok_;
};

// Another uid may not map this process's memory: its connection is closed
// unanswered, and its engine moves the bytes over tcp, saying why in a log
// line. Needs root, to be another uid for a while.
TEST(SameHostHardening, APeerOfAnotherUidIsRefusedAndServedOverTcp) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const MemfdServerAddress at = MemfdServerOf(peer.value().segment);
  ASSERT_FALSE(at.name.empty());
  ASSERT_EQ(at.uid, 0u);
  {
    AsAnotherUid nobody(65534);
    ASSERT_TRUE(nobody.ok()) << std::strerror(errno);
    const int sock = DialMemfdServer(at);
    ASSERT_GE(sock, 0);
    uint8_t req[memfd_wire::kRequestBytes];
    EncodeMemfdRequest({3, 0, 0, 4096}, req);
    (void)!send(sock, req, sizeof(req), MSG_NOSIGNAL);
    std::string got;
    int fds = 0;
    EXPECT_TRUE(ClosedBy(sock, seconds(5), &got, &fds));
    EXPECT_EQ(got, "") << "a refused connection gets no reply";
    EXPECT_EQ(fds, 0);
    close(sock);
    auto e = Engine::Create({});
    ASSERT_TRUE(e.ok());
    auto s = e.value()->OpenSegment(peer.value().segment);
    ASSERT_TRUE(s.ok());
    auto served = RoundTrip(*e.value(), s.value(), peer.value().alloc_addr, 4096);
    EXPECT_EQ(served.first, "tcp");
    EXPECT_EQ(served.second, "tcp");
  }
}

// Under Yama (ptrace_scope 1), a process of the same uid that is not an
// ancestor may not trace one that did not invite it; an engine with shm must
// not invite anyone. The child here is such a process for its parent.
TEST(SameHostHardening, TheEngineLeavesItsProcessUntraceable) {
  int scope = -1;
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
    std::fclose(f);
  }
  if (scope < 1) GTEST_SKIP() << "no Yama restriction here: any same-uid process may trace";
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    WithoutTracePrivilege untraced;
    _exit(ProcessVmError(getppid()) == EPERM ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "a sibling-like process could read this one's memory";
}

// The memfd socket takes bad input like the listener: a malformed request, a
// short one, or one for a memfd that is not registered (as asked) closes that
// connection only; the engine keeps serving the others.
TEST(MemfdSocket, BadRequestsCloseOnlyTheirConnection) {
  EngineOptions o;
  o.connect_timeout = Millis(1000);  // also how long a request may dawdle
  auto owner = Engine::Create(o);
  ASSERT_TRUE(owner.ok());
  auto mem = owner.value()->AllocateMemory(1 << 20);
  ASSERT_TRUE(mem.ok());
  const uint64_t addr = reinterpret_cast<uint64_t>(mem.value());
  auto d = FetchDescriptor(ParseSegmentName(owner.value()->name()).value(), Millis(5000));
  ASSERT_TRUE(d.ok());
  const RegionDesc* region = d.value().Find(addr, 1);
  ASSERT_NE(region, nullptr);
  const std::string_view blob = d.value().BlobOf(*region, "shm");
  ASSERT_EQ(blob.size(), 4u);
  int32_t memfd;
  std::memcpy(&memfd, blob.data(), 4);
  const MemfdServerAddress at = MemfdServerOf(owner.value()->name());
  const MemfdRef good{memfd, addr, region->serial, 1 << 20};

  // Opened first and served last; and one that sends a short request and
  // waits, closed after the timeout meanwhile.
  const int idle = DialMemfdServer(at);
  const int short_one = DialMemfdServer(at);
  ASSERT_GE(idle, 0);
  ASSERT_GE(short_one, 0);
  ASSERT_EQ(send(short_one, "\x46\x4d\x46", 3, MSG_NOSIGNAL), 3);
  auto request = [](const MemfdRef& ref) {
    std::string r(memfd_wire::kRequestBytes, '\0');
    EncodeMemfdRequest(ref, reinterpret_cast<uint8_t*>(r.data()));
    return r;
  };
  std::string bad_version = request(good);
  bad_version[4] = 9;
  std::string bad_padding = request(good);
  bad_padding[12] = 1;
  const std::string unanswered[] = {std::string(memfd_wire::kRequestBytes, '\xab'), bad_version,
                                    bad_padding};
  for (const std::string& bytes : unanswered) {
    const int sock = DialMemfdServer(at);
    ASSERT_GE(sock, 0);
    ASSERT_EQ(send(sock, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    std::string got;
    EXPECT_TRUE(ClosedBy(sock, seconds(5), &got)) << "not closed after " << bytes.size() << " bytes";
    EXPECT_EQ(got, "");
    close(sock);
  }
  // Well formed, but not registered as asked: refused with NotFound, then closed.
  for (const MemfdRef& ref : {MemfdRef{999, addr, region->serial, 1 << 20},
                              MemfdRef{memfd, addr, region->serial + 1, 1 << 20},
                              MemfdRef{memfd, addr + 4096, region->serial, 4096},
                              MemfdRef{memfd, 0, 0, 4096}}) {
    const int sock = DialMemfdServer(at);
    ASSERT_GE(sock, 0);
    const std::string bytes = request(ref);
    ASSERT_EQ(send(sock, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    std::string got;
    int fds = 0;
    EXPECT_TRUE(ClosedBy(sock, seconds(5), &got, &fds)) << "memfd " << ref.memfd;
    ASSERT_EQ(got.size(), memfd_wire::kReplyBytes) << "memfd " << ref.memfd;
    EXPECT_EQ(static_cast<StatusCode>(got[6]), StatusCode::kNotFound);
    EXPECT_EQ(fds, 0);
    close(sock);
  }

  // The first connection is served still, and so is a peer over shm.
  const std::string bytes = request(good);
  ASSERT_EQ(send(idle, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  std::string got;
  int fds = 0;
  EXPECT_FALSE(ClosedBy(idle, Millis(100), &got, &fds)) << "a good request keeps it open";
  EXPECT_EQ(got.size(), memfd_wire::kReplyBytes);
  EXPECT_EQ(got[6], 0);
  EXPECT_EQ(fds, 1);
  close(idle);
  std::string partial;
  EXPECT_TRUE(ClosedBy(short_one, seconds(5), &partial)) << "a short request is cut off";
  EXPECT_EQ(partial, "");
  close(short_one);
  auto page = MapPeerMemfd(d.value(), {d.value().control_memfd, 0, 0, kGenerationPageBytes},
                           seconds(5));
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  munmap(page.value(), kGenerationPageBytes);
  EngineOptions shm;
  shm.transport = "shm";
  auto other = Engine::Create(shm);
  ASSERT_TRUE(other.ok());
  auto s = other.value()->OpenSegment(owner.value()->name());
  ASSERT_TRUE(s.ok());
  auto served = RoundTrip(*other.value(), s.value(), addr + 100, 4096);
  EXPECT_EQ(served.first, "shm");
  EXPECT_EQ(served.second, "shm");
}

}  // namespace
}  // namespace ferry
