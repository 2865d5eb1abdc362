// Bad input gets a clear error, and the process on the other end keeps serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "ferry/engine.h"
#include "integration/peer.h"
#include "integration/raw_client.h"
#include "transfer/frame_wire.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using test::RawClient;

std::unique_ptr<Engine> MakeEngine(const std::string& transport = "") {
  EngineOptions o;
  o.transport = transport;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(BadInput, ZeroLengthNullLocalAndEmptyBatchAreRejectedWhole) {
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok());
  auto e = MakeEngine();
  auto s = e->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok());
  char buf[16];
  std::vector<Request> reqs = {{Op::kWrite, buf, s.value(), peer.value().alloc_addr, 16},
                               {Op::kWrite, buf, s.value(), peer.value().alloc_addr, 0}};
  auto b = e->Submit(reqs);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("zero length"), std::string::npos);
  reqs[1] = {Op::kWrite, nullptr, s.value(), peer.value().alloc_addr, 16};
  EXPECT_EQ(e->Submit(reqs).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(std::vector<Request>{}).status().code(), StatusCode::kInvalidArgument);
}

TEST(BadInput, OverlappingRegistrationIsRejectedAndTheFirstSurvives) {
  auto e = MakeEngine();
  std::vector<char> mem(1 << 16);
  ASSERT_TRUE(e->RegisterMemory(mem.data() + 4096, 8192).ok());
  EXPECT_EQ(e->RegisterMemory(mem.data(), 4097).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(e->RegisterMemory(mem.data() + 12287, 10).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(e->RegisterMemory(mem.data() + 5000, 10).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(e->RegisterMemory(mem.data(), 1 << 16).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(e->RegisterMemory(mem.data(), 4096).ok());  // adjacent is fine
  EXPECT_EQ(e->RegisterMemory(nullptr, 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->RegisterMemory(mem.data() + 20000, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->UnregisterMemory(mem.data() + 1).code(), StatusCode::kNotFound);
  // The first registration is intact: a peer can still write into it.
  auto other = MakeEngine("tcp");
  auto s = other->OpenSegment(e->name());
  ASSERT_TRUE(s.ok());
  char msg[] = "still registered";
  ASSERT_TRUE(other
                  ->Transfer({Op::kWrite, msg, s.value(),
                              reinterpret_cast<uint64_t>(mem.data() + 4096), sizeof(msg)})
                  .ok());
  EXPECT_STREQ(mem.data() + 4096, msg);
  EXPECT_TRUE(e->UnregisterMemory(mem.data() + 4096).ok());
  EXPECT_TRUE(e->UnregisterMemory(mem.data()).ok());
}

TEST(BadInput, UnknownSegment) {
  auto e = MakeEngine();
  EXPECT_EQ(e->OpenSegment("not-a-segment").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->OpenSegment("127.0.0.1:0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->OpenSegment("127.0.0.1:99999").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->OpenSegment("no.such.host:80").status().code(), StatusCode::kInvalidArgument);
  // Nobody listens on port 1.
  auto r = e->OpenSegment("127.0.0.1:1");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  char c;
  auto b = e->Submit(std::vector<Request>{{Op::kRead, &c, 12345, 0x1000, 1}});
  EXPECT_EQ(b.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e->GetSegmentInfo(12345).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e->CloseSegment(12345).code(), StatusCode::kNotFound);
}

TEST(BadInput, MalformedAndTruncatedFramesCloseOnlyThatConnection) {
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok());
  const uint16_t port = peer.value().port();
  const uint64_t base = peer.value().alloc_addr;
  {  // garbage: the connection is closed, not answered
    RawClient c(port);
    ASSERT_TRUE(c.connected());
    char junk[32];
    memset(junk, 0xab, sizeof(junk));
    c.Send(junk, sizeof(junk));
    EXPECT_FALSE(c.ReadHeader().has_value());
    EXPECT_FALSE(c.timed_out());
  }
  {  // right magic, wrong version
    RawClient c(port);
    uint8_t h[wire::kHeaderSize];
    wire::EncodeHeader({wire::Opcode::kRead, StatusCode::kOk, 1, base, 8}, h);
    h[4] = 99;
    c.Send(h, sizeof(h));
    EXPECT_FALSE(c.ReadHeader().has_value());
    EXPECT_FALSE(c.timed_out());
  }
  {  // unknown opcode, and a reply opcode sent as a request
    RawClient c(port);
    uint8_t h[wire::kHeaderSize];
    wire::EncodeHeader({wire::Opcode::kRead, StatusCode::kOk, 1, base, 8}, h);
    h[5] = 200;
    c.Send(h, sizeof(h));
    EXPECT_FALSE(c.ReadHeader().has_value());
    RawClient d(port);
    d.SendHeader(wire::Opcode::kWriteAck, base, 0);
    EXPECT_FALSE(d.ReadHeader().has_value());
    EXPECT_FALSE(d.timed_out());
  }
  {  // a payload larger than any frame may carry
    RawClient c(port);
    c.SendHeader(wire::Opcode::kWrite, base, wire::kMaxPayload + 1);
    EXPECT_FALSE(c.ReadHeader().has_value());
    EXPECT_FALSE(c.timed_out());
  }
  {  // truncated header, then the client goes away
    RawClient c(port);
    c.Send("FERY\x01", 5);
  }
  {  // a write whose payload is cut short by the client closing
    RawClient c(port);
    c.SendHeader(wire::Opcode::kWrite, base, 4096);
    c.Send("partial", 7);
  }
  {  // out-of-range write: the payload is consumed and an error is answered
    RawClient c(port);
    c.SendHeader(wire::Opcode::kWrite, base + (1 << 20) - 10, 100);
    std::vector<char> payload(100, 'z');
    c.Send(payload.data(), payload.size());
    auto h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, wire::Opcode::kWriteAck);
    EXPECT_EQ(h->status, StatusCode::kOutOfRange);
    // The same connection stays usable and in step.
    c.SendHeader(wire::Opcode::kRead, base, 0);
    h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, wire::Opcode::kReadData);
    EXPECT_EQ(h->status, StatusCode::kInvalidArgument);
    c.SendHeader(wire::Opcode::kRead, 0x10, 8);
    h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->status, StatusCode::kOutOfRange);
  }
  // After all of that the peer still serves an engine.
  auto e = MakeEngine("tcp");
  auto s = e->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  char msg[] = "alive", back[sizeof(msg)] = {};
  ASSERT_TRUE(e->Transfer({Op::kWrite, msg, s.value(), base + 3, sizeof(msg)}).ok());
  ASSERT_TRUE(e->Transfer({Op::kRead, back, s.value(), base + 3, sizeof(msg)}).ok());
  EXPECT_STREQ(back, msg);
  // The out-of-range write above left nothing behind.
  char tail[10] = {};
  ASSERT_TRUE(e->Transfer({Op::kRead, tail, s.value(), base + (1 << 20) - 10, 10}).ok());
  for (char ch : tail) EXPECT_EQ(ch, 0);
}

// A request carries status OK: one with its status byte set is not served
// (issue 18, point 4), and its payload is never applied.
TEST(BadInput, ARequestWithItsStatusByteSetClosesTheConnection) {
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok());
  const uint64_t base = peer.value().alloc_addr;
  for (auto op : {wire::Opcode::kHello, wire::Opcode::kGetDescriptor, wire::Opcode::kRead,
                  wire::Opcode::kWrite}) {
    RawClient c(peer.value().port());
    ASSERT_TRUE(c.connected());
    const uint64_t len = op == wire::Opcode::kWrite || op == wire::Opcode::kRead ? 6 : 0;
    uint8_t h[wire::kHeaderSize];
    wire::EncodeHeader(
        {op, StatusCode::kNotFound, 1, op == wire::Opcode::kHello ? 0 : base + 100, len}, h);
    c.Send(h, sizeof(h));
    if (op == wire::Opcode::kWrite) c.Send("poison", 6);
    EXPECT_FALSE(c.ReadHeader().has_value()) << "opcode " << static_cast<int>(op) << " served";
    EXPECT_FALSE(c.timed_out());
  }
  auto e = MakeEngine("tcp");
  auto s = e->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  char back[6] = {};
  ASSERT_TRUE(e->Transfer({Op::kRead, back, s.value(), base + 100, sizeof(back)}).ok());
  for (char ch : back) EXPECT_EQ(ch, 0) << "the flagged write was applied";
}

TEST(BadInput, ConnectionsBeyondTheLimitAreRefusedAndTheRestServed) {
  setenv("FERRY_MAX_CONNECTIONS", "3", 1);
  auto peer = test::StartPeer(1 << 20, 0);
  unsetenv("FERRY_MAX_CONNECTIONS");
  ASSERT_TRUE(peer.ok());
  const uint16_t port = peer.value().port();
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(port));
    held.back()->SendHeader(wire::Opcode::kHello, 0, 0);
    auto h = held.back()->ReadHeader();
    ASSERT_TRUE(h.has_value()) << i;
    EXPECT_EQ(h->opcode, wire::Opcode::kHelloAck);
  }
  RawClient extra(port);
  extra.SendHeader(wire::Opcode::kHello, 0, 0);
  EXPECT_FALSE(extra.ReadHeader().has_value());
  EXPECT_FALSE(extra.timed_out());
  // Closing one makes room again.
  held.pop_back();
  std::this_thread::sleep_for(milliseconds(100));
  RawClient again(port);
  again.SendHeader(wire::Opcode::kHello, 0, 0);
  EXPECT_TRUE(again.ReadHeader().has_value());
}

uint16_t PortOf(const Engine& e) {
  return static_cast<uint16_t>(std::stoi(e.name().substr(e.name().rfind(':') + 1)));
}

// `peer` writes `msg` into `target` at `addr`, retried until it works or
// `deadline` passes; the last status.
Status WriteWhenAdmitted(Engine& peer, const Engine& target, char* msg, size_t n, void* addr,
                         Deadline deadline) {
  Status st = Status::Timeout("never tried");
  while (!deadline.Expired()) {
    auto s = peer.OpenSegment(target.name());
    st = s.ok() ? peer.Transfer({Op::kWrite, msg, s.value(), reinterpret_cast<uint64_t>(addr), n},
                                seconds(5))
                : s.status();
    if (st.ok()) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return st;
}

// Sockets that connect and never send a byte hold no slot past the connect
// timeout (issue 18, point 1): once it has passed, a real peer gets in.
TEST(BadInput, SilentConnectionsAreClosedAfterTheConnectTimeout) {
  setenv("FERRY_MAX_CONNECTIONS", "8", 1);
  EngineOptions o;
  o.connect_timeout = milliseconds(300);
  auto target = Engine::Create(o);
  unsetenv("FERRY_MAX_CONNECTIONS");
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  std::vector<char> mem(4096, 0);
  ASSERT_TRUE(target.value()->RegisterMemory(mem.data(), mem.size()).ok());
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 8 + 4; ++i) {  // every slot, and four past them
    silent.push_back(std::make_unique<RawClient>(PortOf(*target.value())));
    ASSERT_TRUE(silent.back()->connected()) << i;
  }
  auto peer = MakeEngine("tcp");
  char msg[] = "got in";
  Status st = WriteWhenAdmitted(*peer, *target.value(), msg, sizeof(msg), mem.data(),
                                Deadline::After(seconds(20)));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_STREQ(mem.data(), msg);
  for (size_t i = 0; i < silent.size(); ++i) {
    EXPECT_FALSE(silent[i]->ReadHeader().has_value()) << i;
    ASSERT_FALSE(silent[i]->timed_out()) << "silent connection " << i << " is still open";
  }
}

// One source address gets FERRY_MAX_CONNECTIONS_PER_SOURCE of the slots
// (issue 18, point 1); past that its connections are closed, and other
// sources are still served.
TEST(BadInput, ConnectionsPastThePerSourceCapAreClosedWhileOthersAreServed) {
  for (const char* bad : {"abc", "0"}) {
    setenv("FERRY_MAX_CONNECTIONS_PER_SOURCE", bad, 1);
    auto e = Engine::Create({});
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(e.status().message().find("FERRY_MAX_CONNECTIONS_PER_SOURCE"), std::string::npos)
        << e.status().ToString();
  }
  setenv("FERRY_MAX_CONNECTIONS_PER_SOURCE", "6", 1);
  auto target = Engine::Create({});
  unsetenv("FERRY_MAX_CONNECTIONS_PER_SOURCE");
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  std::vector<char> mem(4096, 0);
  ASSERT_TRUE(target.value()->RegisterMemory(mem.data(), mem.size()).ok());
  const uint16_t port = PortOf(*target.value());
  std::vector<std::unique_ptr<RawClient>> held;  // from 127.0.0.2, also loopback
  for (int i = 0; i < 6; ++i) {
    held.push_back(std::make_unique<RawClient>(port, "127.0.0.2"));
    ASSERT_TRUE(held.back()->connected()) << i;
    held.back()->SendHeader(wire::Opcode::kHello, 0, 0);
    auto h = held.back()->ReadHeader();
    ASSERT_TRUE(h.has_value()) << i;
    EXPECT_EQ(h->opcode, wire::Opcode::kHelloAck);
  }
  for (int i = 0; i < 3; ++i) {
    RawClient extra(port, "127.0.0.2");
    ASSERT_TRUE(extra.connected());
    extra.SendHeader(wire::Opcode::kHello, 0, 0);
    EXPECT_FALSE(extra.ReadHeader().has_value()) << "extra connection " << i << " was served";
    EXPECT_FALSE(extra.timed_out());
  }
  // An engine from 127.0.0.1 is another source: it gets in at once.
  auto peer = MakeEngine("tcp");
  char msg[] = "other source";
  auto s = peer->OpenSegment(target.value()->name());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(peer->Transfer({Op::kWrite, msg, s.value(), reinterpret_cast<uint64_t>(mem.data()),
                              sizeof(msg)})
                  .ok());
  EXPECT_STREQ(mem.data(), msg);
  // The connections it holds are still served.
  held.front()->SendHeader(wire::Opcode::kHello, 0, 0);
  auto h = held.front()->ReadHeader();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, wire::Opcode::kHelloAck);
}

TEST(BadInput, MalformedDescriptorReplyIsAProtocolError) {
  // A fake listener that answers GetDescriptor with a bad descriptor.
  uint16_t port = 0;
  int lfd = test::ListenOnLoopback(&port);
  ASSERT_GE(lfd, 0);
  std::thread fake = test::AnswerOneDescriptorFetch(lfd, {'F', 'D', 'S', 'C', 'x', 'x'});
  auto e = MakeEngine();
  auto s = e->OpenSegment("127.0.0.1:" + std::to_string(port));
  fake.join();
  close(lfd);
  EXPECT_EQ(s.status().code(), StatusCode::kProtocolError) << s.status().ToString();
}

// `ferry serve` swaps its GPU or memfd buffer on SIGUSR1 (for
// registration-change tests). With neither it says so, and keeps serving what
// it has.
TEST(ServeControl, SwapWithNothingToSwapIsAClearErrorAndChangesNothing) {
  auto peer = test::StartPeer(0, 1 << 20);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(peer.value().proc->Signal(SIGUSR1).ok());
  auto line = peer.value().proc->ReadLine(std::chrono::seconds(10));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_NE(line.value().find("no --gpu-alloc or --alloc buffer to swap"), std::string::npos)
      << line.value();
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  auto seg = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(seg.ok());
  std::vector<char> out(4096, 0x3c), in(4096, 0);
  ASSERT_TRUE(e.value()
                  ->Transfer({Op::kWrite, out.data(), seg.value(), peer.value().heap_addr, 4096})
                  .ok());
  ASSERT_TRUE(
      e.value()->Transfer({Op::kRead, in.data(), seg.value(), peer.value().heap_addr, 4096}).ok());
  EXPECT_EQ(in, out);
}

TEST(PeerFailure, KilledMidTransferFailsWithinTheDeadline) {
  for (const char* transport : {"tcp", "shm"}) {
    // Heap memory, so shm goes through process_vm and sees the death.
    auto peer = test::StartPeer(0, 64 << 20);
    ASSERT_TRUE(peer.ok());
    auto e = MakeEngine(transport);
    auto s = e->OpenSegment(peer.value().segment);
    ASSERT_TRUE(s.ok());
    std::vector<char> buf(64 << 20);
    std::vector<Request> reqs;
    for (int i = 0; i < 64; ++i) {
      reqs.push_back({Op::kRead, buf.data() + i * (1 << 20), s.value(),
                      peer.value().heap_addr + static_cast<uint64_t>(i) * (1 << 20), 1 << 20});
    }
    int failed_batches = 0;
    auto t0 = Clock::now();
    for (int round = 0; round < 50 && failed_batches == 0; ++round) {
      auto b = e->Submit(reqs, seconds(5));
      ASSERT_TRUE(b.ok());
      if (round == 2) peer.value().proc->Signal(SIGKILL).ok();
      Status st = b.value()->Wait(seconds(10));
      ASSERT_NE(st.code(), StatusCode::kTimeout) << transport << ": Wait hung";
      EXPECT_TRUE(b.value()->Poll().done());
      if (!st.ok()) {
        ++failed_batches;
        EXPECT_TRUE(st.code() == StatusCode::kConnectionLost ||
                    st.code() == StatusCode::kUnavailable)
            << transport << ": " << st.ToString();
      }
    }
    EXPECT_EQ(failed_batches, 1) << transport << ": the death was never reported";
    EXPECT_LT(SecondsSince(t0), 30.0);
    // Later requests fail at once too.
    Status st = e->Transfer(reqs[0], seconds(5));
    EXPECT_FALSE(st.ok());
  }
}

TEST(PeerFailure, AStalledPeerFailsRequestsAtTheirDeadline) {
  auto peer = test::StartPeer(16 << 20, 0);
  ASSERT_TRUE(peer.ok());
  auto e = MakeEngine("tcp");
  auto s = e->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok());
  std::vector<char> buf(16 << 20);
  ASSERT_TRUE(peer.value().proc->Signal(SIGSTOP).ok());
  auto t0 = Clock::now();
  Status st = e->Transfer({Op::kWrite, buf.data(), s.value(), peer.value().alloc_addr, 16 << 20},
                          milliseconds(500));
  double took = SecondsSince(t0);
  peer.value().proc->Signal(SIGCONT).ok();
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
  EXPECT_LT(took, 5.0);
  // Once the peer runs again, a fresh request succeeds.
  EXPECT_TRUE(
      e->Transfer({Op::kRead, buf.data(), s.value(), peer.value().alloc_addr, 4096}, seconds(10))
          .ok());
}

}  // namespace
}  // namespace ferry
