// The master's socket calls (store/rpc/master_wire.h): the data path's calls
// go over them and answer as gRPC does, the secret is checked there too, a
// malformed frame closes only its connection, and where no socket can be had
// calls go by gRPC.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "common/bytes.h"
#include "integration/key_file.h"
#include "proto/store.pb.h"
#include "store/master/service.h"
#include "store/rpc/call_auth.h"
#include "store/rpc/master_client.h"
#include "store/rpc/master_wire.h"
#include "store_cluster.h"

namespace ferry::test {
namespace {

namespace pb = ::ferry::store::v1;
namespace mw = store::master_wire;
namespace framing = store::framing;

constexpr char kSecret[] = "this cluster's secret: 32 bytes!";

// A bare connection to the master's socket, its greeting read.
class RawSocket {
 public:
  explicit RawSocket(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);  // EINPROGRESS
    greeting_ = framing::Receive(mw::kFormat, fd_, Deadline::After(Millis(5000)), Millis(5000));
  }
  ~RawSocket() { close(fd_); }
  const Result<framing::Frame>& greeting() const { return greeting_; }
  Status Send(uint16_t type, std::span<const uint8_t> payload) {
    return framing::Send(mw::kFormat, fd_, type, 7, 1000, StatusCode::kOk, payload,
                         Deadline::After(Millis(5000)));
  }
  Status SendBytes(const std::vector<uint8_t>& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                   static_cast<ssize_t>(bytes.size())
               ? Status::Ok()
               : Status::FromErrno(errno, "send");
  }
  Result<framing::Frame> Reply() {
    return framing::Receive(mw::kFormat, fd_, Deadline::After(Millis(5000)), Millis(5000));
  }
  // The master closed this connection.
  bool Closed() {
    auto r = Reply();
    return !r.ok() && r.status().code() == StatusCode::kConnectionLost;
  }

 private:
  int fd_ = -1;
  Result<framing::Frame> greeting_ = Status::Internal("not connected");
};

// An Exists request's payload for `key`, with `token`.
std::vector<uint8_t> ExistsPayload(const std::string& key, const std::string& token = "") {
  pb::KeysRequest req;
  req.add_keys(key);
  return mw::EncodeRequest(token, req.SerializeAsString()).value();
}

store::MasterServerOptions Options() {
  store::MasterServerOptions mo;
  mo.http_port = -1;
  return mo;
}

TEST(MasterSocket, DataCallsGoOverTheSocketAndAnswerAsGrpcDoes) {
  auto server = store::MasterServer::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_GT(server.value()->socket_port(), 0);
  const std::string& address = server.value()->address();
  auto fast = store::MasterClient::Connect(address, Millis(5000));
  setenv("FERRY_MASTER_SOCKET", "0", 1);
  auto slow = store::MasterClient::Connect(address, Millis(5000));
  unsetenv("FERRY_MASTER_SOCKET");
  ASSERT_TRUE(fast.ok() && slow.ok());
  ASSERT_TRUE(fast.value()->Mount({"127.0.0.1:1", 1, {{0x10000, 1 << 20}}, {}, false}).ok());
  EXPECT_EQ(server.value()->socket_calls(), 0u) << "Mount stays on gRPC";

  auto begun = fast.value()->PutBegin({{"k", 4096, 1, "", StorePin::kNone, Millis(0)}}, "", false);
  ASSERT_TRUE(begun.ok()) << begun.status().ToString();
  ASSERT_TRUE(begun.value()[0].ok()) << begun.value()[0].status().ToString();
  auto ended = fast.value()->PutEnd({{"k", begun.value()[0].value().put_id, true, false}});
  ASSERT_TRUE(ended.ok() && ended.value()[0].ok());
  const uint64_t after_put = server.value()->socket_calls();
  EXPECT_EQ(after_put, 2u);
  EXPECT_EQ(server.value()->socket_connections(), 1u) << "one connection, reused";

  // The same answers both ways, failures included.
  for (auto* c : {fast.value().get(), slow.value().get()}) {
    auto found = c->Get({"k", "missing"});
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    ASSERT_TRUE(found.value()[0].ok());
    EXPECT_EQ(found.value()[0].value().location.size, 4096u);
    EXPECT_EQ(found.value()[1].status().code(), StatusCode::kNotFound);
    auto exists = c->Exists({"k", "missing"});
    ASSERT_TRUE(exists.ok());
    EXPECT_TRUE(exists.value()[0].ok());
    EXPECT_EQ(exists.value()[1].code(), StatusCode::kNotFound);
    auto stats = c->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats.value().objects, 1u);
    auto taken = c->PutBegin({{"k", 4096, 1, "", StorePin::kNone, Millis(0)}}, "", false);
    ASSERT_TRUE(taken.ok());
    EXPECT_EQ(taken.value()[0].status().code(), StatusCode::kAlreadyExists);
  }
  EXPECT_EQ(server.value()->socket_calls(), after_put + 4) << "the gRPC client used the socket";
  auto removed = fast.value()->Remove({"k"}, true);
  ASSERT_TRUE(removed.ok() && removed.value()[0].ok());
  EXPECT_EQ(fast.value()->Exists({"k"}).value()[0].code(), StatusCode::kNotFound);
}

TEST(MasterSocket, ASecretIsCheckedOnTheSocketToo) {
  KeyFile key("socket", kSecret);
  ASSERT_TRUE(key.ok());
  auto mo = Options();
  mo.auth_key_file = key.path();
  auto server = store::MasterServer::Start(mo);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto right = auth::LoadConfigured(key.path());
  ASSERT_TRUE(right.ok());
  auto with_key =
      store::MasterClient::Connect(server.value()->address(), Millis(5000), right.value());
  ASSERT_TRUE(with_key.ok());
  ASSERT_TRUE(with_key.value()->Stats().ok());
  EXPECT_EQ(server.value()->socket_calls(), 1u);
  EXPECT_EQ(server.value()->auth_failures(), 0u);
  // A client without the key learns the port, and is refused there.
  auto without = store::MasterClient::Connect(server.value()->address(), Millis(5000));
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without.value()->Stats().status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(server.value()->socket_calls(), 2u);
  EXPECT_EQ(server.value()->auth_failures(), 1u);

  // By hand: no token, another method's token, and a replay.
  RawSocket raw(server.value()->socket_port());
  ASSERT_TRUE(raw.greeting().ok()) << raw.greeting().status().ToString();
  const auto exists = static_cast<uint16_t>(mw::Type::kExists);
  auto token = store::MakeCallToken(*right.value(), "Exists");
  auto other = store::MakeCallToken(*right.value(), "Remove");
  ASSERT_TRUE(token.ok() && other.ok());
  struct Case {
    std::string token;
    StatusCode want;
  };
  for (const Case& c :
       {Case{"", StatusCode::kUnauthenticated}, Case{other.value(), StatusCode::kUnauthenticated},
        Case{token.value(), StatusCode::kOk}, Case{token.value(), StatusCode::kUnauthenticated}}) {
    ASSERT_TRUE(raw.Send(exists, ExistsPayload("k", c.token)).ok());
    auto reply = raw.Reply();
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply.value().code, c.want) << mw::ReplyMessage(reply.value().payload);
    EXPECT_EQ(reply.value().id, 7u);
    EXPECT_EQ(reply.value().type, exists);
  }
  EXPECT_EQ(server.value()->auth_failures(), 4u);
}

TEST(MasterSocket, AMalformedFrameClosesOnlyItsConnection) {
  auto server = store::MasterServer::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = server.value()->socket_port();
  auto client = store::MasterClient::Connect(server.value()->address(), Millis(5000));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(client.value()->Stats().ok());

  // Within a good frame, a bad request is answered and the connection stays.
  RawSocket kept(port);
  ASSERT_TRUE(kept.greeting().ok());
  const std::vector<uint8_t> garbage = {0, 0, 0xff, 0xff, 0xff};
  const std::vector<uint8_t> cut = {9, 0, 'x'};  // a token of 9 bytes, 1 there
  for (const auto& payload : {garbage, cut, std::vector<uint8_t>{}}) {
    ASSERT_TRUE(kept.Send(static_cast<uint16_t>(mw::Type::kGet), payload).ok());
    auto reply = kept.Reply();
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_NE(reply.value().code, StatusCode::kOk);
  }
  ASSERT_TRUE(kept.Send(static_cast<uint16_t>(mw::Type::kGreeting), {}).ok());
  auto not_a_call = kept.Reply();
  ASSERT_TRUE(not_a_call.ok());
  EXPECT_EQ(not_a_call.value().code, StatusCode::kInvalidArgument);

  // A bad header: the connection is closed.
  auto header = [](uint32_t magic, uint16_t version, uint16_t type, uint32_t length) {
    std::vector<uint8_t> out;
    ByteWriter w(&out);
    w.U32(magic);
    w.U16(version);
    w.U16(type);
    w.U64(1);
    w.U32(length);
    w.U32(100);
    w.U32(0);
    return out;
  };
  for (const auto& bad : {header(0x12345678, mw::kVersion, 6, 0), header(mw::kMagic, 9, 6, 0),
                          header(mw::kMagic, mw::kVersion, 99, 0),
                          header(mw::kMagic, mw::kVersion, 6, mw::kMaxPayload + 1)}) {
    RawSocket raw(port);
    ASSERT_TRUE(raw.greeting().ok());
    ASSERT_TRUE(raw.SendBytes(bad).ok());
    EXPECT_TRUE(raw.Closed());
  }
  // The others go on.
  ASSERT_TRUE(kept.Send(static_cast<uint16_t>(mw::Type::kExists), ExistsPayload("k")).ok());
  auto reply = kept.Reply();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply.value().code, StatusCode::kOk);
  EXPECT_TRUE(client.value()->Stats().ok());
}

TEST(MasterSocket, WithoutASocketCallsGoByGrpc) {
  auto mo = Options();
  mo.socket_max_connections = 1;
  auto server = store::MasterServer::Start(mo);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  {
    RawSocket holder(server.value()->socket_port());  // the one connection
    ASSERT_TRUE(holder.greeting().ok());
    RawSocket refused(server.value()->socket_port());
    ASSERT_TRUE(refused.greeting().ok());
    EXPECT_EQ(refused.greeting().value().code, StatusCode::kUnavailable);
    EXPECT_TRUE(refused.Closed());
    auto client = store::MasterClient::Connect(server.value()->address(), Millis(5000));
    ASSERT_TRUE(client.ok());
    for (int i = 0; i < 3; ++i) {
      auto stats = client.value()->Stats();
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    }
    EXPECT_EQ(server.value()->socket_calls(), 0u);
  }
  // A master with none: the same calls, by gRPC.
  mo.socket_port = -1;
  auto none = store::MasterServer::Start(mo);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value()->socket_port(), 0);
  auto client = store::MasterClient::Connect(none.value()->address(), Millis(5000));
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(client.value()->Stats().ok());
}

TEST(MasterSocket, AMasterRestartedAtItsAddressIsFoundAgain) {
  auto first = store::MasterServer::Start(Options());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string address = first.value()->address();
  auto client = store::MasterClient::Connect(address, Millis(5000));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(client.value()->Stats().ok());
  ASSERT_EQ(first.value()->socket_calls(), 1u);
  auto mo = Options();
  mo.port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  first.value().reset();
  auto second = store::MasterServer::Start(mo);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  // Calls reach it by gRPC while the socket is looked for again, and soon
  // over its new socket.
  EXPECT_TRUE(Eventually([&] {
    (void)client.value()->Stats();
    return second.value()->socket_calls() > 0;
  }));
  EXPECT_TRUE(client.value()->Stats().ok());
}

}  // namespace
}  // namespace ferry::test
