// Faults injected between an engine and a peer process (fault_transport.h):
// each kind, with its exact outcome, and the engine usable afterwards. Also
// tcp's optional payload checksum (EngineOptions::tcp_checksum), which is
// what lets a target catch a corrupted frame. No test here asserts a timing.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "ferry/engine.h"
#include "integration/fault_transport.h"
#include "integration/peer.h"
#include "integration/raw_client.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using test::Fault;
using test::FaultInjector;
using test::FaultKind;

constexpr uint64_t kAlloc = 32ull << 20;
constexpr uint64_t kChunk = 512 << 10;  // EngineOptions::tcp_chunk_bytes, by default

FaultInjector& Injector() { return FaultInjector::Get(); }

// True once `cond` holds, polled up to 10 s.
template <typename Cond>
bool Within(Cond cond) {
  Deadline d = Deadline::After(seconds(10));
  while (!cond()) {
    if (d.Expired()) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

class FaultTcp : public ::testing::Test {
 protected:
  void SetUp() override {
    Injector().Reset();
    auto p = test::StartPeer(kAlloc, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    peer_ = std::move(p).value();
    base_ = peer_.alloc_addr;
    Use(false);
  }

  void TearDown() override {
    engine_.reset();  // fails or finishes whatever it holds
    const auto c = Injector().counts();
    EXPECT_EQ(c.completed_twice, 0u);
    EXPECT_EQ(c.completed, c.posted) << "a task given to fault_tcp was never completed";
    Injector().Reset();
  }

  // A fresh engine forcing fault_tcp, with or without the checksum. With one
  // lane, a connection that stays up is the only one the proxy accepts.
  void Use(bool checksum, int lanes = 4) {
    engine_.reset();
    EngineOptions o;
    o.transport = test::kFaultTransport;
    o.tcp_checksum = checksum;
    o.tcp_lanes = lanes;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    auto s = engine_->OpenSegment(peer_.segment);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    seg_ = s.value();
  }

  Status Write(const std::vector<char>& src, uint64_t remote) {
    return engine_->Transfer({Op::kWrite, const_cast<char*>(src.data()), seg_, remote, src.size()});
  }
  Status Read(std::vector<char>& dst, uint64_t remote) {
    return engine_->Transfer({Op::kRead, dst.data(), seg_, remote, dst.size()});
  }
  // The peer's bytes at [remote, remote+n), read with no fault armed.
  std::vector<char> PeerBytes(uint64_t remote, size_t n) {
    std::vector<char> out(n);
    Status st = Read(out, remote);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }
  static std::vector<char> Pattern(size_t n, uint64_t seed) {
    std::vector<char> v(n);
    test::FillRandom(v.data(), n, seed);
    return v;
  }
  // Writes then reads back 8 requests spread over every lane.
  void ExpectServing(uint64_t seed) {
    const size_t block = 100000;
    std::vector<char> src = Pattern(8 * block, seed), dst(src.size());
    std::vector<Request> w, r;
    for (size_t i = 0; i < 8; ++i) {
      const uint64_t remote = base_ + (16 << 20) + i * block;
      w.push_back({Op::kWrite, src.data() + i * block, seg_, remote, block});
      r.push_back({Op::kRead, dst.data() + i * block, seg_, remote, block});
    }
    for (auto* reqs : {&w, &r}) {
      auto b = engine_->Submit(*reqs);
      ASSERT_TRUE(b.ok());
      Status st = b.value()->Wait(seconds(30));
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(b.value()->Result(0).transport, test::kFaultTransport);
    }
    EXPECT_TRUE(src == dst);
  }

  test::Peer peer_;
  uint64_t base_ = 0;
  std::unique_ptr<Engine> engine_;
  SegmentId seg_ = 0;
};

TEST_F(FaultTcp, PassThroughCompletesEveryTaskOnce) {
  for (bool checksum : {false, true}) {
    SCOPED_TRACE(checksum ? "with checksum" : "without checksum");
    Use(checksum);
    const auto before = Injector().counts();
    auto data = Pattern(3 * kChunk + 17, 7);  // four chunks
    ASSERT_TRUE(Write(data, base_ + 3).ok());
    EXPECT_TRUE(PeerBytes(base_ + 3, data.size()) == data);
    ExpectServing(checksum ? 2 : 1);
    const auto c = Injector().counts();
    EXPECT_EQ(c.hits, before.hits);
    EXPECT_GE(c.posted - before.posted, 8u + 16u);
    EXPECT_EQ(c.completed, c.posted);
  }
}

// ---- delay ----

TEST_F(FaultTcp, DelayedTasksArriveAndSucceed) {
  Injector().Arm({FaultKind::kDelay, Op::kWrite, 8, milliseconds(20)});
  ExpectServing(3);  // 8 writes, each held a while first
  EXPECT_EQ(Injector().counts().hits, 8u);
  EXPECT_EQ(Injector().counts().held, 0u);
}

TEST_F(FaultTcp, AHeldWriteWaitsWhileOthersComplete) {
  Injector().Arm({FaultKind::kDelay, Op::kWrite, 1, test::kUntilReleased});
  auto held = Pattern(4096, 4), other = Pattern(4096, 5);
  Request a{Op::kWrite, held.data(), seg_, base_ + 4096, held.size()};
  auto ba = engine_->Submit(std::span<const Request>(&a, 1));
  ASSERT_TRUE(ba.ok());
  ASSERT_TRUE(Within([] { return Injector().counts().held == 1; }));
  // Not held: passes the held one, which stays pending until released.
  ASSERT_TRUE(Write(other, base_ + 8192).ok());
  EXPECT_FALSE(ba.value()->Poll().done());
  EXPECT_TRUE(PeerBytes(base_ + 4096, 4096) == std::vector<char>(4096, 0)) << "applied while held";
  Injector().ReleaseHeld();
  Status st = ba.value()->Wait(seconds(30));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(PeerBytes(base_ + 4096, 4096) == held);
  EXPECT_TRUE(PeerBytes(base_ + 8192, 4096) == other);
}

TEST_F(FaultTcp, AHeldRequestFailsAtItsDeadlineOnce) {
  Injector().Arm({FaultKind::kDelay, Op::kRead, 1, test::kUntilReleased});
  std::vector<char> dst(4096, 0x7e);
  Request r{Op::kRead, dst.data(), seg_, base_, dst.size()};
  auto b = engine_->Submit(std::span<const Request>(&r, 1), milliseconds(300));
  ASSERT_TRUE(b.ok());
  Status st = b.value()->Wait(seconds(30));
  ASSERT_TRUE(b.value()->Result(0).done) << "never failed: " << st.ToString();
  EXPECT_EQ(b.value()->Result(0).status.code(), StatusCode::kTimeout) << st.ToString();
  EXPECT_EQ(b.value()->Poll().failed, 1u);
  EXPECT_EQ(Injector().counts().held, 0u);
  EXPECT_TRUE(dst == std::vector<char>(4096, 0x7e)) << "a read that never ran wrote its buffer";
  ExpectServing(6);
}

// ---- fail ----

TEST_F(FaultTcp, AnInjectedFailureFailsOnlyItsRequestOnce) {
  for (Op op : {Op::kWrite, Op::kRead}) {
    SCOPED_TRACE(op == Op::kWrite ? "write" : "read");
    Injector().Arm({FaultKind::kFail, op, 1, {}, StatusCode::kUnavailable});
    std::vector<char> buf(8 * 4096);
    std::vector<Request> reqs;
    for (uint64_t i = 0; i < 8; ++i) {
      reqs.push_back({op, buf.data() + i * 4096, seg_, base_ + i * 4096, 4096});
    }
    auto b = engine_->Submit(reqs);
    ASSERT_TRUE(b.ok());
    Status st = b.value()->Wait(seconds(30));
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    const BatchStatus bs = b.value()->Poll();
    EXPECT_EQ(bs.failed, 1u);
    EXPECT_EQ(bs.succeeded, 7u);
    size_t unavailable = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      unavailable += b.value()->Result(i).status.code() == StatusCode::kUnavailable;
    }
    EXPECT_EQ(unavailable, 1u);
  }
  // One task of a four-chunk request: the request fails, once.
  Injector().Arm({FaultKind::kFail, Op::kRead, 1, {}, StatusCode::kConnectionLost});
  std::vector<char> big(4 * kChunk);
  Request r{Op::kRead, big.data(), seg_, base_, big.size()};
  auto b = engine_->Submit(std::span<const Request>(&r, 1));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value()->Wait(seconds(30)).code(), StatusCode::kConnectionLost);
  EXPECT_EQ(b.value()->Poll().failed, 1u);
  EXPECT_EQ(Injector().counts().hits, 3u);
  ExpectServing(7);
}

// ---- drop mid-chunk ----

// The connection is cut half-way through a write's payload: that request
// fails with ConnectionLost, the target closes the connection and serves
// on, to another engine meanwhile and to this one, whose one lane
// reconnects. With the checksum, the cut write changed nothing there: it
// is applied only once whole and checked.
TEST_F(FaultTcp, AWriteCutMidPayloadFailsAndTheTargetServesOn) {
  auto bystander = Engine::Create({}).value();  // plain tcp, its own connection
  auto bseg = bystander->OpenSegment(peer_.segment).value();
  for (bool checksum : {false, true}) {
    SCOPED_TRACE(checksum ? "with checksum" : "without checksum");
    Use(checksum, 1);
    const uint64_t remote = base_ + (1 << 20) + 5;
    const auto old = PeerBytes(remote, 65536);
    const auto before = Injector().counts();
    Injector().Arm({FaultKind::kDrop, Op::kWrite, 1});
    Status st = Write(Pattern(65536, 8), remote);
    EXPECT_EQ(st.code(), StatusCode::kConnectionLost) << st.ToString();
    const auto c = Injector().counts();
    EXPECT_EQ(c.hits, before.hits + 1);
    EXPECT_EQ(c.frame_addr, remote);
    EXPECT_TRUE(Within([&] {
      return Injector().counts().target_closed == before.target_closed + 1;
    })) << "the target kept the cut connection open";
    std::vector<char> ping = Pattern(1000, 9), back(1000);
    ASSERT_TRUE(bystander->Transfer({Op::kWrite, ping.data(), bseg, base_ + 100, 1000}).ok());
    ASSERT_TRUE(bystander->Transfer({Op::kRead, back.data(), bseg, base_ + 100, 1000}).ok());
    EXPECT_TRUE(ping == back);
    if (checksum) {
      EXPECT_TRUE(PeerBytes(remote, 65536) == old) << "part of the cut write landed";
    }
    ExpectServing(10);
    EXPECT_EQ(Injector().counts().accepted, c.accepted + 1) << "the lane did not reconnect once";
  }
}

TEST_F(FaultTcp, AReadCutMidPayloadFailsAndTheNextSucceeds) {
  Use(false, 1);
  const auto data = Pattern(65536, 11);
  ASSERT_TRUE(Write(data, base_ + 77).ok());
  Injector().Arm({FaultKind::kDrop, Op::kRead, 1});
  std::vector<char> dst(65536);
  Status st = Read(dst, base_ + 77);
  EXPECT_EQ(st.code(), StatusCode::kConnectionLost) << st.ToString();
  EXPECT_EQ(Injector().counts().hits, 1u);
  EXPECT_TRUE(Within([] { return Injector().counts().target_closed == 1; }))
      << "the target kept the cut connection open";
  ASSERT_TRUE(Read(dst, base_ + 77).ok());
  EXPECT_TRUE(dst == data);
  EXPECT_EQ(Injector().counts().accepted, 2u);  // the one lane, then again
  ExpectServing(12);
}

// ---- corrupt ----

// One chunk of a four-chunk write is corrupted in flight: the target finds
// it fails its checksum, refuses it with ProtocolError and leaves its range
// as it was; the connection stays up and in step (one lane, connected
// once), so the next write on it succeeds.
TEST_F(FaultTcp, WithTheChecksumACorruptWriteIsRefusedAndNotApplied) {
  Use(true, 1);
  const uint64_t remote = base_ + 4096;
  const auto old = Pattern(4 * kChunk, 13), fresh = Pattern(4 * kChunk, 14);
  ASSERT_TRUE(Write(old, remote).ok());
  Injector().Arm({FaultKind::kCorrupt, Op::kWrite, 1});
  Status st = Write(fresh, remote);
  EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.ToString();
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.ToString();
  const auto c = Injector().counts();
  ASSERT_EQ(c.hits, 1u);
  ASSERT_GE(c.frame_addr, remote);
  const uint64_t off = c.frame_addr - remote;
  ASSERT_LE(off + c.frame_length, old.size());
  const auto chunk = PeerBytes(c.frame_addr, c.frame_length);
  EXPECT_TRUE(std::equal(chunk.begin(), chunk.end(), old.begin() + static_cast<long>(off)))
      << "the corrupted chunk changed the target's memory";
  ASSERT_TRUE(Write(fresh, remote).ok());
  EXPECT_TRUE(PeerBytes(remote, fresh.size()) == fresh);
  EXPECT_EQ(Injector().counts().accepted, 1u);
}

TEST_F(FaultTcp, WithTheChecksumACorruptReadFails) {
  Use(true, 1);
  const auto data = Pattern(200000, 15);
  ASSERT_TRUE(Write(data, base_ + 9).ok());
  Injector().Arm({FaultKind::kCorrupt, Op::kRead, 1});
  std::vector<char> dst(data.size());
  Status st = Read(dst, base_ + 9);
  EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.ToString();
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.ToString();
  EXPECT_EQ(Injector().counts().hits, 1u);
  ASSERT_TRUE(Read(dst, base_ + 9).ok());
  EXPECT_TRUE(dst == data);
  EXPECT_EQ(Injector().counts().accepted, 1u);
}

// The control: without the checksum the same corruption lands unseen, one
// byte flipped where the proxy flipped it. So the checksum is what catches it.
TEST_F(FaultTcp, WithoutTheChecksumCorruptionGoesUnseen) {
  const uint64_t remote = base_ + 123;
  const auto data = Pattern(65536, 16);
  Injector().Arm({FaultKind::kCorrupt, Op::kWrite, 1});
  ASSERT_TRUE(Write(data, remote).ok());
  const auto c = Injector().counts();
  ASSERT_EQ(c.hits, 1u);
  const auto got = PeerBytes(remote, data.size());
  size_t differ = 0, where = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    if (got[i] != data[i]) ++differ, where = i;
  }
  EXPECT_EQ(differ, 1u);
  EXPECT_EQ(where, c.frame_addr - remote + c.frame_at);
}

// ---- the checksum itself ----

TEST(TcpChecksum, TheEnvironmentVariableIsZeroOrOne) {
  for (const char* bad : {"2", "-1", "yes"}) {
    setenv("FERRY_TCP_CHECKSUM", bad, 1);
    auto e = Engine::Create({});
    unsetenv("FERRY_TCP_CHECKSUM");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("FERRY_TCP_CHECKSUM"), std::string::npos)
        << e.status().ToString();
  }
  setenv("FERRY_TCP_CHECKSUM", "1", 1);
  auto e = Engine::Create({});
  unsetenv("FERRY_TCP_CHECKSUM");
  EXPECT_TRUE(e.ok()) << e.status().ToString();
}

// Plain tcp with the checksum, across sizes around the chunk and staging
// boundaries and at unaligned addresses, against a peer without it (a
// target checks any flagged frame).
TEST(TcpChecksum, RoundTripsEverySizeAgainstAPeerWithout) {
  auto peer = test::StartPeer(80ull << 20, 0);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EngineOptions o;
  o.transport = "tcp";
  o.tcp_checksum = true;
  auto e = Engine::Create(o).value();
  auto seg = e->OpenSegment(peer.value().segment).value();
  uint64_t seed = 20;
  for (size_t n : {size_t{1}, size_t{4095}, size_t{kChunk}, size_t{kChunk + 1},
                   size_t{(8 << 20) - 3}, size_t{64 << 20}}) {
    std::vector<char> src(n), dst(n);
    test::FillRandom(src.data(), n, ++seed);
    const uint64_t remote = peer.value().alloc_addr + 1 + seed % 4096;
    ASSERT_TRUE(e->Transfer({Op::kWrite, src.data(), seg, remote, n}).ok()) << n;
    ASSERT_TRUE(e->Transfer({Op::kRead, dst.data(), seg, remote, n}).ok()) << n;
    ASSERT_TRUE(src == dst) << n;
  }
}

// At the frame level: a flagged write with a wrong sum is refused and not
// applied, a right one is, a flagged read is answered with the sum of its
// bytes, a rejected flagged write's trailer is consumed too, and the
// connection stays in step through all of it; an unknown flag, or a flag on
// a frame that takes none, closes the connection.
TEST(TcpChecksum, TheTargetRefusesAMismatchAndStaysInStep) {
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const uint64_t base = peer.value().alloc_addr;
  using wire::Opcode;
  test::RawClient c(peer.value().port());
  ASSERT_TRUE(c.connected());
  auto send = [&](Opcode op, uint64_t addr, const std::string& payload, uint32_t sum,
                  uint64_t length) {
    uint8_t h[wire::kHeaderSize], t[wire::kCrcBytes];
    wire::EncodeHeader({op, StatusCode::kOk, 5, addr, length, wire::kFlagCrc32c}, h);
    wire::EncodeCrc(sum, t);
    c.Send(h, sizeof(h));
    if (op == Opcode::kWrite) {
      c.Send(payload.data(), payload.size());
      c.Send(t, sizeof(t));
    }
  };
  const std::string data = "checksummed payload";
  const uint32_t sum = crc32c::Value(data.data(), data.size());
  send(Opcode::kWrite, base + 10, data, sum ^ 1, data.size());
  auto h = c.ReadHeader();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, Opcode::kWriteAck);
  EXPECT_EQ(h->status, StatusCode::kProtocolError);
  send(Opcode::kRead, base + 10, "", 0, data.size());
  h = c.ReadHeader();
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->status, StatusCode::kOk);
  EXPECT_EQ(h->flags, wire::kFlagCrc32c);
  std::string got(data.size(), '?');
  uint8_t t[wire::kCrcBytes];
  ASSERT_TRUE(c.Read(got.data(), got.size()));
  ASSERT_TRUE(c.Read(t, sizeof(t)));
  EXPECT_EQ(got, std::string(data.size(), '\0')) << "the refused write was applied";
  EXPECT_EQ(wire::DecodeCrc(t), crc32c::Value(got.data(), got.size()));
  send(Opcode::kWrite, base + (1 << 20) - 4, data, sum, data.size());  // out of range
  h = c.ReadHeader();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->status, StatusCode::kOutOfRange);
  send(Opcode::kWrite, base + 10, data, sum, data.size());
  h = c.ReadHeader();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->status, StatusCode::kOk);
  send(Opcode::kRead, base + 10, "", 0, data.size());
  h = c.ReadHeader();
  ASSERT_TRUE(h.has_value());
  ASSERT_TRUE(c.Read(got.data(), got.size()));
  ASSERT_TRUE(c.Read(t, sizeof(t)));
  EXPECT_EQ(got, data);
  EXPECT_EQ(wire::DecodeCrc(t), sum);
  for (auto [op, flags] : {std::pair{Opcode::kRead, uint8_t{2}},
                           std::pair{Opcode::kGetDescriptor, wire::kFlagCrc32c}}) {
    test::RawClient d(peer.value().port());
    uint8_t hd[wire::kHeaderSize];
    wire::EncodeHeader({op, StatusCode::kOk, 1, base, 8}, hd);
    hd[7] = flags;
    d.Send(hd, sizeof(hd));
    EXPECT_FALSE(d.ReadHeader().has_value()) << "flags " << int(flags) << " served";
    EXPECT_FALSE(d.timed_out());
  }
}

// Small writes that reach the target together are acked together: their
// replies wait for the frames already in hand (FERRY_TCP_HOLD_ACKS_KIB), then
// leave in one send, each answering its own write, in order. A write that
// arrives alone is answered at once (the engine's transfers below).
TEST(TcpLanes, AcksOfSmallWritesReadTogetherLeaveTogether) {
  setenv("FERRY_TCP_HOLD_ACKS_KIB", "256", 1);  // the default, whatever the run's environment
  auto peer = test::StartPeer(1 << 20, 0);
  unsetenv("FERRY_TCP_HOLD_ACKS_KIB");
  ASSERT_TRUE(peer.ok());
  const uint64_t base = peer.value().alloc_addr;
  constexpr int kWrites = 4;
  constexpr size_t kBytes = 1024;
  std::vector<uint8_t> frames;
  for (int i = 0; i < kWrites; ++i) {
    uint8_t h[wire::kHeaderSize];
    wire::EncodeHeader({wire::Opcode::kWrite, StatusCode::kOk, 10u + i, base + i * kBytes, kBytes},
                       h);
    frames.insert(frames.end(), h, h + sizeof(h));
    frames.insert(frames.end(), kBytes, static_cast<uint8_t>('a' + i));
  }
  test::RawClient c(peer.value().port());
  ASSERT_TRUE(c.connected());
  c.Send(frames.data(), frames.size());  // one segment on loopback
  uint8_t acks[kWrites * wire::kHeaderSize];
  EXPECT_EQ(c.ReadSome(acks, sizeof(acks)), sizeof(acks)) << "the acks left in several sends";
  for (int i = 0; i < kWrites; ++i) {
    auto h = wire::DecodeHeader(acks + i * wire::kHeaderSize);
    ASSERT_TRUE(h.ok()) << i;
    EXPECT_EQ(h.value().opcode, wire::Opcode::kWriteAck);
    EXPECT_EQ(h.value().status, StatusCode::kOk);
    EXPECT_EQ(h.value().id, 10u + i);
  }
  EngineOptions o;
  o.transport = "tcp";
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok());
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<char> back(kWrites * kBytes);
  ASSERT_TRUE(e.value()->Transfer({Op::kRead, back.data(), s.value(), base, back.size()}).ok());
  for (int i = 0; i < kWrites; ++i) EXPECT_EQ(back[i * kBytes + kBytes - 1], 'a' + i) << i;
}

}  // namespace
}  // namespace ferry
