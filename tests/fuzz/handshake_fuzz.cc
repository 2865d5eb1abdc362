// The authenticated handshake (transfer/frame_wire.h, transfer/handshake.h)
// from both ends, with a cluster secret. The first input byte picks the side
// and how the harness plays the other one; the rest are the fuzzer's bytes.
//
// Target side, a real Listener holding the key:
//   0: the bytes are what a peer sends. A model of the listener says which
//      frame gets which reply (a Challenge, whose proof must verify, or a
//      refusal) and where it closes; no frame is ever served.
//   1: the harness runs the exchange honestly (its nonce and expected epoch
//      from the bytes): the target must prove the key, take the proof and
//      then serve the descriptor.
//   2: the same, answering with the proof of an earlier connection (a
//      replay): refused, and nothing served.
// Initiator side, AsyncHello holding the key, against a fake target:
//   3: the target answers the Hello with the bytes;
//   4: it answers with a valid challenge (nonce and epoch from the bytes),
//      checks the initiator's proof, then sends the bytes.
//   The exchange must end once, and succeed only after a valid challenge.
// The registered memory never changes: no frame before the handshake, nor
// any after a failed one, reaches it.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "fuzz.h"
#include "transfer/descriptor.h"
#include "transfer/frame_wire.h"
#include "transfer/handshake.h"
#include "transfer/listener.h"
#include "transfer/memory_registry.h"
#include "transfer/tcp/target.h"

namespace ferry {
namespace {

using fuzz::GetLe;
using wire::Header;
using wire::Opcode;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kEpoch = 0x5eed;
constexpr uint64_t kMemBytes = 4096;
constexpr auto kStall = std::chrono::seconds(5);  // far beyond any honest answer
constexpr size_t kChallengeBytes = auth::kNonceBytes + auth::kMacBytes;

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>(i * 131 + 7); }

struct World {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::shared_ptr<const auth::Key> key =
      std::make_shared<auth::Key>("fuzz-cluster-secret-0123456789abcdef");
  MemoryRegistry registry;
  uint8_t* mem = new uint8_t[kMemBytes];  // its own heap block, for ASan
  std::vector<uint8_t> descriptor;
  std::unique_ptr<TcpTarget> target;
  std::unique_ptr<Listener> listener;
  sockaddr_in addr{};  // the listener's
  int fake = -1;       // the fake target's listening socket, for the initiator side
  sockaddr_in fake_addr{};
  std::optional<auth::Mac> recorded;  // an honest proof of an earlier connection
  std::thread thread;
};

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Made once and never destroyed: libFuzzer exits with the io thread running.
World& GetWorld() {
  static World* w = [] {
    fuzz::QuietLogs();
    auto* w = new World;
    for (uint64_t i = 0; i < kMemBytes; ++i) w->mem[i] = Pattern(i);
    const auto base = reinterpret_cast<uint64_t>(w->mem);
    FUZZ_CHECK(w->registry.Add({.addr = base, .length = kMemBytes}).ok(), "register");
    SegmentDescriptor d;
    d.epoch = kEpoch;
    d.host_id = "fuzz";
    d.transports = {"tcp"};
    d.transport_blobs = {""};
    d.regions = {{.addr = base, .length = kMemBytes, .blobs = {""}}};
    w->descriptor = EncodeDescriptor(d);
    w->target = std::make_unique<TcpTarget>(TcpTarget::Config{}, w->registry, nullptr);
    Listener::Config cfg;
    cfg.host = "127.0.0.1";
    cfg.epoch = kEpoch;
    cfg.key = w->key;
    cfg.max_connections = cfg.max_connections_per_source = 1 << 20;
    auto l = Listener::Start(w->io, cfg, [w] { return w->descriptor; }, {w->target.get()});
    FUZZ_CHECK(l.ok(), "%s", l.status().ToString().c_str());
    w->listener = std::move(l).value();
    w->addr = Loopback(w->listener->port());
    w->fake = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any = Loopback(0);
    FUZZ_CHECK(bind(w->fake, reinterpret_cast<sockaddr*>(&any), sizeof(any)) == 0, "bind");
    FUZZ_CHECK(listen(w->fake, 16) == 0, "listen");
    socklen_t len = sizeof(w->fake_addr);
    getsockname(w->fake, reinterpret_cast<sockaddr*>(&w->fake_addr), &len);
    w->thread = std::thread([w] { w->io.run(); });
    return w;
  }();
  return *w;
}

// ---- blocking socket helpers, each bounded by `until` ----

int Wait(int fd, short events, Clock::time_point until) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    FUZZ_CHECK(left.count() > 0, "stalled");
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return p.revents;
  }
}

// False when the peer closed first (a reset included).
bool RecvExact(int fd, uint8_t* out, size_t n, Clock::time_point until) {
  size_t got = 0;
  while (got < n) {
    Wait(fd, POLLIN, until);
    const ssize_t r = recv(fd, out + got, n - got, 0);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return false;
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

// False when the peer closed (then not all may be sent).
bool SendAll(int fd, const uint8_t* p, size_t n, Clock::time_point until) {
  size_t sent = 0;
  while (sent < n) {
    Wait(fd, POLLOUT, until);
    const ssize_t r = send(fd, p + sent, n - sent, MSG_NOSIGNAL);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) return false;
    sent += static_cast<size_t>(r);
  }
  return true;
}

// Sends `stream` while reading, half-closes once it is sent, and returns
// everything received until the peer closes. `reset`: it closed with our
// bytes unread, and what it sent last may be lost.
std::vector<uint8_t> Exchange(int fd, const std::vector<uint8_t>& stream, Clock::time_point until,
                              bool* reset) {
  *reset = false;
  std::vector<uint8_t> in;
  size_t sent = 0;
  bool shut = false;
  for (;;) {
    if (!shut && sent == stream.size()) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    const int ev = Wait(fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), until);
    if ((ev & POLLOUT) && !shut) {
      const ssize_t n = send(fd, stream.data() + sent, stream.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) sent = stream.size();  // refused
    }
    if (ev & (POLLIN | POLLHUP | POLLERR)) {
      uint8_t buf[16 << 10];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) in.insert(in.end(), buf, buf + n);
      if (n == 0) return in;
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        *reset = true;
        return in;
      }
    }
  }
}

std::vector<uint8_t> Frame(const Header& h, const uint8_t* payload = nullptr, size_t n = 0) {
  std::vector<uint8_t> out(wire::kHeaderSize + n);
  wire::EncodeHeader(h, out.data());
  if (n > 0) std::memcpy(out.data() + wire::kHeaderSize, payload, n);
  return out;
}

auth::Nonce NonceFrom(const uint8_t* data, size_t size) {
  auth::Nonce n{};
  std::memcpy(n.data(), data, std::min(size, n.size()));
  return n;
}

void CheckMemory(const World& w) {
  for (uint64_t i = 0; i < kMemBytes; ++i) {
    FUZZ_CHECK(w.mem[i] == Pattern(i), "registered memory changed at +%llu",
               static_cast<unsigned long long>(i));
  }
}

// ---- the target side ----

struct Reply {
  Opcode opcode;
  StatusCode status;
  uint64_t id;
  // A Challenge's proof is checked against this Hello's nonce and epoch.
  auth::Nonce nonce{};
  uint64_t expected = 0;
};

// Mode 0: what the listener must answer to `in`, frame by frame, up to
// where it stops reading.
std::vector<Reply> Predict(const uint8_t* in, size_t size) {
  std::vector<Reply> out;
  bool challenged = false;
  for (size_t pos = 0; size - pos >= wire::kHeaderSize;) {
    auto d = wire::DecodeHeader(in + pos);
    pos += wire::kHeaderSize;
    if (!d.ok() || d.value().status != StatusCode::kOk) break;  // closed, no reply
    const Header h = d.value();
    if (!challenged && h.opcode == Opcode::kHello && h.length == auth::kNonceBytes) {
      if (size - pos < auth::kNonceBytes) break;  // waits for the rest, then sees EOF
      out.push_back(
          {Opcode::kChallenge, StatusCode::kOk, h.id, NonceFrom(in + pos, size - pos), h.addr});
      pos += auth::kNonceBytes;
      challenged = true;
      continue;
    }
    if (challenged && h.opcode == Opcode::kProof && h.length == auth::kMacBytes) {
      // The fuzzer cannot make a proof for the listener's fresh nonce.
      if (size - pos < auth::kMacBytes) break;
      out.push_back({Opcode::kHelloAck, StatusCode::kUnauthenticated, h.id});
      break;
    }
    if (h.opcode == Opcode::kHello || h.opcode == Opcode::kProof) {
      out.push_back({Opcode::kHelloAck, StatusCode::kUnauthenticated, h.id});
    } else if (h.opcode == Opcode::kGetDescriptor) {
      out.push_back({Opcode::kDescriptor, StatusCode::kUnauthenticated, h.id});
    }
    break;  // refused: the listener reads no further
  }
  return out;
}

// Checks a Challenge's payload: the target's nonce and its proof.
void CheckChallenge(const World& w, const Header& h, const uint8_t* payload,
                    const auth::Nonce& ours, uint64_t expected, auth::Nonce* theirs) {
  FUZZ_CHECK(h.status == StatusCode::kOk && h.addr == kEpoch && h.length == kChallengeBytes,
             "a bad challenge: status %d addr 0x%llx length %llu", static_cast<int>(h.status),
             static_cast<unsigned long long>(h.addr), static_cast<unsigned long long>(h.length));
  std::memcpy(theirs->data(), payload, theirs->size());
  auth::Mac proof{};
  std::memcpy(proof.data(), payload + theirs->size(), proof.size());
  FUZZ_CHECK(auth::SameMac(proof, handshake::TargetProof(*w.key, ours, *theirs, kEpoch, expected)),
             "the listener's proof does not verify");
}

void RawPeer(World& w, const uint8_t* data, size_t size) {
  const std::vector<Reply> want = Predict(data, size);
  const int fd = fuzz::ConnectTo(w.addr);
  bool reset = false;
  const auto in = Exchange(fd, {data, data + size}, Clock::now() + kStall, &reset);
  close(fd);
  // A reset (the listener refused a frame with more bytes behind it) may
  // cut the replies short; a clean close may not.
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (reset && in.size() - at < wire::kHeaderSize) return;
    FUZZ_CHECK(in.size() - at >= wire::kHeaderSize, "%zu of %zu replies", i, want.size());
    auto h = wire::DecodeHeader(in.data() + at);
    FUZZ_CHECK(h.ok(), "reply %zu: %s", i, h.status().ToString().c_str());
    at += wire::kHeaderSize;
    FUZZ_CHECK(h.value().opcode == want[i].opcode && h.value().status == want[i].status &&
                   h.value().id == want[i].id,
               "reply %zu: opcode %d status %d; expected opcode %d status %d", i,
               static_cast<int>(h.value().opcode), static_cast<int>(h.value().status),
               static_cast<int>(want[i].opcode), static_cast<int>(want[i].status));
    if (want[i].opcode == Opcode::kChallenge) {
      if (reset && in.size() - at < kChallengeBytes) return;
      FUZZ_CHECK(in.size() - at >= kChallengeBytes, "a short challenge");
      auth::Nonce theirs{};
      CheckChallenge(w, h.value(), in.data() + at, want[i].nonce, want[i].expected, &theirs);
      at += kChallengeBytes;
    } else {
      FUZZ_CHECK(h.value().length == 0, "a refusal with a payload");
    }
  }
  FUZZ_CHECK(at == in.size(), "%zu bytes after the last reply expected", in.size() - at);
  (void)reset;
}

void HonestPeer(World& w, const uint8_t* data, size_t size, bool replay) {
  const auto until = Clock::now() + kStall;
  const auth::Nonce ours = NonceFrom(data, size);
  const uint64_t pick = size > 32 ? data[32] % 3 : 0;
  const uint64_t expected = pick == 0 ? 0 : pick == 1 ? kEpoch : kEpoch + 1;
  const int fd = fuzz::ConnectTo(w.addr);
  FUZZ_CHECK(SendAll(fd,
                     Frame({Opcode::kHello, StatusCode::kOk, 7, expected, auth::kNonceBytes},
                           ours.data(), ours.size())
                         .data(),
                     wire::kHeaderSize + ours.size(), until),
             "the listener closed on an honest hello");
  uint8_t head[wire::kHeaderSize], challenge[kChallengeBytes];
  FUZZ_CHECK(RecvExact(fd, head, sizeof(head), until), "no challenge");
  auto h = wire::DecodeHeader(head);
  FUZZ_CHECK(h.ok() && h.value().opcode == Opcode::kChallenge && h.value().id == 7,
             "not a challenge");
  FUZZ_CHECK(RecvExact(fd, challenge, sizeof(challenge), until), "a short challenge");
  auth::Nonce theirs{};
  CheckChallenge(w, h.value(), challenge, ours, expected, &theirs);
  const auth::Mac honest = handshake::InitiatorProof(*w.key, ours, theirs, kEpoch, expected);
  const bool replaying = replay && w.recorded.has_value();
  const auth::Mac proof = replaying ? *w.recorded : honest;
  w.recorded = honest;
  const auto p =
      Frame({Opcode::kProof, StatusCode::kOk, 8, 0, proof.size()}, proof.data(), proof.size());
  FUZZ_CHECK(SendAll(fd, p.data(), p.size(), until), "the listener closed before the proof");
  FUZZ_CHECK(RecvExact(fd, head, sizeof(head), until), "no answer to the proof");
  auto ack = wire::DecodeHeader(head);
  FUZZ_CHECK(ack.ok() && ack.value().opcode == Opcode::kHelloAck && ack.value().id == 8,
             "not a hello ack");
  if (replaying && proof != honest) {
    FUZZ_CHECK(ack.value().status == StatusCode::kUnauthenticated,
               "a replayed proof was taken (status %d)", static_cast<int>(ack.value().status));
    bool reset = false;
    const auto more =
        Exchange(fd, Frame({Opcode::kGetDescriptor, StatusCode::kOk, 9, 0, 0}), until, &reset);
    close(fd);
    FUZZ_CHECK(more.empty(), "%zu bytes served after a refused proof", more.size());
    return;
  }
  const StatusCode st = expected == kEpoch + 1 ? StatusCode::kPeerRestarted : StatusCode::kOk;
  FUZZ_CHECK(ack.value().status == st && ack.value().addr == kEpoch, "hello ack status %d",
             static_cast<int>(ack.value().status));
  bool reset = false;
  const auto in =
      Exchange(fd, Frame({Opcode::kGetDescriptor, StatusCode::kOk, 9, 0, 0}), until, &reset);
  close(fd);
  const size_t n = w.descriptor.size();
  FUZZ_CHECK(!reset && in.size() == wire::kHeaderSize + n, "%zu bytes for the descriptor",
             in.size());
  auto desc = wire::DecodeHeader(in.data());
  FUZZ_CHECK(
      desc.ok() && desc.value().opcode == Opcode::kDescriptor &&
          desc.value().status == StatusCode::kOk && desc.value().length == n &&
          std::equal(w.descriptor.begin(), w.descriptor.end(), in.begin() + wire::kHeaderSize),
      "the descriptor was not served after the handshake");
}

// ---- the initiator side ----

void FakeTarget(World& w, const uint8_t* data, size_t size, bool challenge) {
  const auto until = Clock::now() + kStall;
  const uint64_t expected = size > 0 ? data[0] % 2 * kEpoch : 0;
  if (size > 0) ++data, --size;
  // ConnectTo waits out a connect that libFuzzer's timer interrupts (asio's
  // blocking connect failed with EINTR there).
  auto sock = std::make_unique<asio::ip::tcp::socket>(w.io);
  asio::error_code ec;
  sock->assign(asio::ip::tcp::v4(), fuzz::ConnectTo(w.fake_addr), ec);
  FUZZ_CHECK(!ec, "assign: %s", ec.message().c_str());
  int fd = -1;
  while ((fd = accept4(w.fake, nullptr, nullptr, SOCK_CLOEXEC)) < 0 && errno == EINTR) {
  }
  FUZZ_CHECK(fd >= 0, "accept: %s", std::strerror(errno));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  auto result = std::make_shared<std::promise<std::pair<Status, int>>>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  handshake::HelloConfig cfg;
  cfg.key = w.key;
  cfg.expected_epoch = expected;
  cfg.peer_name = "fake";
  asio::post(w.io, [s = sock.get(), cfg, result, calls] {
    handshake::AsyncHello(*s, cfg, [result, calls](Status st, uint64_t) {
      if (calls->fetch_add(1) == 0) result->set_value({std::move(st), 1});
    });
  });

  uint8_t hello[wire::kHeaderSize + auth::kNonceBytes];
  FUZZ_CHECK(RecvExact(fd, hello, sizeof(hello), until), "no hello with a nonce");
  auto h = wire::DecodeHeader(hello);
  FUZZ_CHECK(h.ok() && h.value().opcode == Opcode::kHello &&
                 h.value().length == auth::kNonceBytes && h.value().addr == expected,
             "a bad hello");
  const auth::Nonce init = NonceFrom(hello + wire::kHeaderSize, auth::kNonceBytes);
  bool proved = false;
  if (challenge) {
    const auth::Nonce mine = NonceFrom(data, size);
    const uint64_t epoch = size > 32 ? GetLe(data + 32, std::min<int>(8, size - 32)) : kEpoch;
    const auth::Mac proof = handshake::TargetProof(*w.key, init, mine, epoch, expected);
    std::vector<uint8_t> payload(mine.begin(), mine.end());
    payload.insert(payload.end(), proof.begin(), proof.end());
    const auto c = Frame({Opcode::kChallenge, StatusCode::kOk, 0, epoch, payload.size()},
                         payload.data(), payload.size());
    FUZZ_CHECK(SendAll(fd, c.data(), c.size(), until), "the initiator left before its proof");
    uint8_t answer[wire::kHeaderSize + auth::kMacBytes];
    FUZZ_CHECK(RecvExact(fd, answer, sizeof(answer), until), "no proof after a valid challenge");
    auto p = wire::DecodeHeader(answer);
    auth::Mac got{};
    std::memcpy(got.data(), answer + wire::kHeaderSize, got.size());
    FUZZ_CHECK(
        p.ok() && p.value().opcode == Opcode::kProof &&
            auth::SameMac(got, handshake::InitiatorProof(*w.key, init, mine, epoch, expected)),
        "the initiator's proof does not verify");
    proved = true;
    const size_t used = std::min<size_t>(size, 40);
    data += used;
    size -= used;
  }
  (void)SendAll(fd, data, size, until);  // it may stop reading at a bad frame
  shutdown(fd, SHUT_WR);
  auto fut = result->get_future();
  FUZZ_CHECK(fut.wait_until(until) == std::future_status::ready, "the handshake never ended");
  const Status st = fut.get().first;
  close(fd);
  std::promise<void> gone;
  asio::post(w.io, [&] {
    sock.reset();
    gone.set_value();
  });
  gone.get_future().wait();
  FUZZ_CHECK(calls->load() == 1, "done called %d times", calls->load());
  FUZZ_CHECK(!st.ok() || proved, "the handshake succeeded without a valid challenge");
}

}  // namespace
}  // namespace ferry

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  World& w = GetWorld();
  const uint8_t mode = data[0] % 5;
  ++data, --size;
  switch (mode) {
    case 0: RawPeer(w, data, size); break;
    case 1:
    case 2: HonestPeer(w, data, size, mode == 2); break;
    default: FakeTarget(w, data, size, mode == 4);
  }
  CheckMemory(w);
  return 0;
}
