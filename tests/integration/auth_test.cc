// The cluster secret on the engine's listener (issue 18, point 2): a peer
// that proves it is served; one that does not (no key, another key, a
// recorded handshake sent again, a request before the handshake) touches no
// memory, and the listener counts it.
#include "common/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ferry/engine.h"
#include "integration/key_file.h"
#include "integration/peer.h"
#include "integration/raw_client.h"
#include "transfer/frame_wire.h"
#include "transfer/handshake.h"

namespace ferry {
namespace {

using test::KeyFile;
using test::RawClient;
using wire::Opcode;

constexpr char kSecret[] = "this cluster's secret: 32 bytes!";
constexpr char kOtherSecret[] = "another cluster's secret, as long";

Result<std::unique_ptr<Engine>> MakeEngine(const std::string& key_file,
                                           const std::string& transport = "tcp") {
  EngineOptions o;
  o.transport = transport;
  o.auth_key_file = key_file;
  return Engine::Create(o);
}

uint16_t PortOf(const Engine& e) {
  return static_cast<uint16_t>(std::stoi(e.name().substr(e.name().rfind(':') + 1)));
}

// A target engine in this process that holds `key`, with 4 KiB of zeros
// registered at `mem`.
struct Target {
  std::unique_ptr<Engine> engine;
  std::vector<char> mem = std::vector<char>(4096, 0);
  uint64_t addr() const { return reinterpret_cast<uint64_t>(mem.data()); }
  uint16_t port() const { return PortOf(*engine); }
  bool Untouched() const {
    return std::all_of(mem.begin(), mem.end(), [](char c) { return c == 0; });
  }
};

Result<Target> StartTarget(const std::string& key_file) {
  Target t;
  FERRY_ASSIGN_OR_RETURN(t.engine, MakeEngine(key_file, ""));
  FERRY_RETURN_IF_ERROR(t.engine->RegisterMemory(t.mem.data(), t.mem.size()));
  return t;
}

// The raw bytes of a frame: its header, then `payload`.
std::vector<uint8_t> Frame(Opcode op, uint64_t addr, const void* payload, size_t n) {
  std::vector<uint8_t> f(wire::kHeaderSize + n);
  wire::EncodeHeader({op, StatusCode::kOk, 9, addr, n}, f.data());
  if (n > 0) std::memcpy(f.data() + wire::kHeaderSize, payload, n);
  return f;
}

// A Read of `len` bytes at `addr`: a header alone.
std::vector<uint8_t> ReadFrame(uint64_t addr, uint64_t len) {
  std::vector<uint8_t> f(wire::kHeaderSize);
  wire::EncodeHeader({Opcode::kRead, StatusCode::kOk, 9, addr, len}, f.data());
  return f;
}

// Frames sent with one send(): a target that refuses the first and closes
// cannot make a later send fail.
std::vector<uint8_t> Cat(std::initializer_list<std::vector<uint8_t>> frames) {
  std::vector<uint8_t> out;
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

// The answer to a refused handshake: HelloAck Unauthenticated, then the
// connection closes with nothing else answered (no write, no read).
void ExpectRefused(RawClient& c) {
  auto h = c.ReadHeader();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, Opcode::kHelloAck);
  EXPECT_EQ(h->status, StatusCode::kUnauthenticated);
  EXPECT_FALSE(c.ReadHeader().has_value()) << "a request after the refusal was answered";
  EXPECT_FALSE(c.timed_out());
}

TEST(Auth, PeersThatProveTheKeyAreServedOverTcp) {
  KeyFile key("served", kSecret);
  ASSERT_TRUE(key.ok());
  // The target is a `ferry serve` process that reads the variable.
  setenv(auth::kKeyFileEnv, key.path().c_str(), 1);
  auto peer = test::StartPeer(1 << 20, 0);
  unsetenv(auth::kKeyFileEnv);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto e = MakeEngine(key.path());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  char msg[] = "proved", back[sizeof(msg)] = {};
  const uint64_t at = peer.value().alloc_addr + 64;
  ASSERT_TRUE(e.value()->Transfer({Op::kWrite, msg, s.value(), at, sizeof(msg)}).ok());
  std::vector<Request> read = {{Op::kRead, back, s.value(), at, sizeof(back)}};
  auto b = e.value()->Submit(read);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b.value()->Wait(std::chrono::seconds(10)).ok());
  EXPECT_EQ(b.value()->Result(0).transport, "tcp");
  EXPECT_STREQ(back, msg);

  // In this process too, where the counter can be read: nobody was refused.
  auto target = StartTarget(key.path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  auto t = e.value()->OpenSegment(target.value().engine->name());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(e.value()->Transfer({Op::kWrite, msg, t.value(), target.value().addr(), 6}).ok());
  EXPECT_EQ(std::memcmp(target.value().mem.data(), msg, 6), 0);
  EXPECT_EQ(target.value().engine->Stats().auth_failures, 0u);
}

TEST(Auth, EnginesWithAnotherKeyOrNoneAreRefused) {
  KeyFile key("refused", kSecret), other("refused-other", kOtherSecret);
  ASSERT_TRUE(key.ok() && other.ok());
  auto target = StartTarget(key.path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  for (const std::string& file : {other.path(), std::string()}) {
    auto e = MakeEngine(file);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    auto s = e.value()->OpenSegment(target.value().engine->name());
    EXPECT_EQ(s.status().code(), StatusCode::kUnauthenticated)
        << (file.empty() ? "no key: " : "another key: ") << s.status().ToString();
  }
  // The engine without a key was refused by the target; the one with another
  // key refused the target first (its proof did not verify).
  EXPECT_EQ(target.value().engine->Stats().auth_failures, 1u);
  EXPECT_TRUE(target.value().Untouched());

  // An engine with a key refuses a target that holds none: nothing would be
  // proven to it.
  auto open = MakeEngine("", "");
  ASSERT_TRUE(open.ok());
  auto e = MakeEngine(key.path());
  ASSERT_TRUE(e.ok());
  auto s = e.value()->OpenSegment(open.value()->name());
  EXPECT_EQ(s.status().code(), StatusCode::kUnauthenticated) << s.status().ToString();
}

// Frames before the handshake are never served: a write is not applied (its
// payload is not even read) and a read returns nothing; each is counted.
TEST(Auth, RequestsBeforeTheHandshakeTouchNoMemory) {
  KeyFile key("early", kSecret);
  ASSERT_TRUE(key.ok());
  auto target = StartTarget(key.path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const Target& t = target.value();
  uint64_t refused = 0;
  {  // a write with no hello at all
    RawClient c(t.port());
    auto w = Frame(Opcode::kWrite, t.addr(), "poison", 6);
    c.Send(w.data(), w.size());
    EXPECT_FALSE(c.ReadHeader().has_value());
    EXPECT_FALSE(c.timed_out());
    EXPECT_EQ(t.engine->Stats().auth_failures, ++refused);
  }
  {  // a read with no hello
    RawClient c(t.port());
    c.SendHeader(Opcode::kRead, t.addr(), 6);
    EXPECT_FALSE(c.ReadHeader().has_value()) << "a read was answered";
    EXPECT_FALSE(c.timed_out());
    EXPECT_EQ(t.engine->Stats().auth_failures, ++refused);
  }
  {  // a hello without a nonce (an engine with no key), then a write
    RawClient c(t.port());
    auto both =
        Cat({Frame(Opcode::kHello, 0, nullptr, 0), Frame(Opcode::kWrite, t.addr(), "poison", 6)});
    c.Send(both.data(), both.size());
    ExpectRefused(c);
    EXPECT_EQ(t.engine->Stats().auth_failures, ++refused);
  }
  {  // the descriptor, which names every registered range
    RawClient c(t.port());
    c.SendHeader(Opcode::kGetDescriptor, 0, 0);
    auto h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, Opcode::kDescriptor);
    EXPECT_EQ(h->status, StatusCode::kUnauthenticated);
    EXPECT_EQ(h->length, 0u);
    EXPECT_FALSE(c.ReadHeader().has_value());
    EXPECT_EQ(t.engine->Stats().auth_failures, ++refused);
  }
  {  // a proof out of turn, with no challenge to answer
    RawClient c(t.port());
    auth::Mac junk{};
    auto p = Frame(Opcode::kProof, 0, junk.data(), junk.size());
    c.Send(p.data(), p.size());
    ExpectRefused(c);
    EXPECT_EQ(t.engine->Stats().auth_failures, ++refused);
  }
  EXPECT_TRUE(t.Untouched());
}

// A raw initiator's side of the handshake, answering with `key`: sends the
// Hello, reads the challenge and sends the proof, then `after` with it. The
// handshake's bytes go to `sent`, the target's nonce to `theirs`; `*proved`
// says whether the target's proof verifies with `key`. False if it broke off
// before the proof.
bool Handshake(RawClient& c, const auth::Key& key, std::vector<uint8_t>* sent, auth::Nonce* theirs,
               bool* proved, const std::vector<uint8_t>& after = {}) {
  auth::Nonce mine = auth::NewNonce().value();
  auto hello = Frame(Opcode::kHello, 0, mine.data(), mine.size());
  c.Send(hello.data(), hello.size());
  auto h = c.ReadHeader();
  if (!h || h->opcode != Opcode::kChallenge || h->length != 64) return false;
  uint8_t challenge[64];
  if (!c.Read(challenge, sizeof(challenge))) return false;
  std::memcpy(theirs->data(), challenge, theirs->size());
  auth::Mac proof{};
  std::memcpy(proof.data(), challenge + 32, proof.size());
  *proved = auth::SameMac(proof, handshake::TargetProof(key, mine, *theirs, h->addr, 0));
  const auth::Mac answer = handshake::InitiatorProof(key, mine, *theirs, h->addr, 0);
  auto p = Frame(Opcode::kProof, 0, answer.data(), answer.size());
  auto out = Cat({p, after});
  c.Send(out.data(), out.size());
  *sent = hello;
  sent->insert(sent->end(), p.begin(), p.end());
  return true;
}

TEST(Auth, AWrongProofAndAReplayedHandshakeGetNoMemoryAccess) {
  KeyFile key("replay", kSecret), other("replay-other", kOtherSecret);
  ASSERT_TRUE(key.ok() && other.ok());
  auto right = auth::LoadConfigured(key.path());
  auto wrong = auth::LoadConfigured(other.path());
  ASSERT_TRUE(right.ok() && wrong.ok());
  auto target = StartTarget(key.path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const Target& t = target.value();

  // A genuine handshake, recorded, then a write that is served.
  std::vector<uint8_t> recorded;
  auth::Nonce first{};
  {
    RawClient c(t.port());
    bool proved = false;
    ASSERT_TRUE(Handshake(c, *right.value(), &recorded, &first, &proved));
    EXPECT_TRUE(proved) << "the target's proof does not verify";
    auto h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, Opcode::kHelloAck);
    EXPECT_EQ(h->status, StatusCode::kOk);
    auto w = Frame(Opcode::kWrite, t.addr(), "first", 5);
    c.Send(w.data(), w.size());
    h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, Opcode::kWriteAck);
    EXPECT_EQ(h->status, StatusCode::kOk);
  }
  EXPECT_EQ(std::memcmp(t.mem.data(), "first", 5), 0);
  EXPECT_EQ(t.engine->Stats().auth_failures, 0u);

  // The same bytes on a new connection, then a write and a read: the target
  // challenges with a fresh nonce, the recorded proof does not answer it.
  {
    RawClient c(t.port());
    auto all =
        Cat({recorded, Frame(Opcode::kWrite, t.addr(), "replay", 6), ReadFrame(t.addr(), 5)});
    c.Send(all.data(), all.size());
    auto h = c.ReadHeader();
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, Opcode::kChallenge);
    uint8_t challenge[64];
    ASSERT_TRUE(c.Read(challenge, sizeof(challenge)));
    EXPECT_NE(std::memcmp(challenge, first.data(), first.size()), 0) << "the nonce was reused";
    ExpectRefused(c);
  }
  EXPECT_EQ(t.engine->Stats().auth_failures, 1u);

  // A proof made with another key.
  {
    RawClient c(t.port());
    std::vector<uint8_t> sent;
    auth::Nonce theirs{};
    bool proved = true;
    ASSERT_TRUE(Handshake(c, *wrong.value(), &sent, &theirs, &proved,
                          Frame(Opcode::kWrite, t.addr(), "wrong!", 6)));
    EXPECT_FALSE(proved) << "the target's proof verified with another key";
    ExpectRefused(c);
  }
  EXPECT_EQ(t.engine->Stats().auth_failures, 2u);
  EXPECT_EQ(std::memcmp(t.mem.data(), "first\0", 6), 0) << "a refused write was applied";
}

TEST(Auth, MalformedKeyFilesFailAtCreateNamingTheFile) {
  KeyFile empty("empty", ""), newlines("newlines", "\n\n"), short_key("short", "too short");
  KeyFile group("group", kSecret, 0640), others("others", kSecret, 0604);
  ASSERT_TRUE(empty.ok() && newlines.ok() && short_key.ok() && group.ok() && others.ok());
  const std::string missing = "/tmp/ferry-test-" + std::to_string(getpid()) + "-missing.key";
  struct Case {
    std::string path;
    const char* says;
  };
  for (const Case& c :
       {Case{missing, "cannot be read"}, Case{empty.path(), "is empty"},
        Case{newlines.path(), "is empty"}, Case{short_key.path(), "16 to 4096"},
        Case{group.path(), "group or others"}, Case{others.path(), "group or others"},
        Case{"/tmp", "not a regular file"}}) {
    auto e = MakeEngine(c.path);
    ASSERT_FALSE(e.ok()) << c.path;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << c.path;
    EXPECT_NE(e.status().message().find(c.path), std::string::npos) << e.status().ToString();
    EXPECT_NE(e.status().message().find(c.says), std::string::npos) << e.status().ToString();
  }
  // The variable, the same way, for an engine and for a `ferry serve` process.
  setenv(auth::kKeyFileEnv, group.path().c_str(), 1);
  auto e = Engine::Create({});
  auto peer = test::StartPeer(1 << 20, 0);
  unsetenv(auth::kKeyFileEnv);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(auth::kKeyFileEnv), std::string::npos)
      << e.status().ToString();
  EXPECT_FALSE(peer.ok()) << "ferry serve started with a group-readable key file";
}

}  // namespace
}  // namespace ferry
