// Conformance suite of the transfer engine, run over every registered
// transport: against a peer in another process, or, for a transport that
// reaches only this process, against the engine itself. A transport is
// skipped by its capabilities (one that moves no host memory, or is not
// available here), never by its name.
#include "ferry/engine.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "integration/peer.h"
#include "transfer/io_pool.h"
#include "transfer/memory_registry.h"
#include "transfer/metadata.h"
#include "transfer/transport.h"

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

}  // namespace
}  // namespace ferry
