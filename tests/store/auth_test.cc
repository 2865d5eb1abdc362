// The cluster secret in the store (issue 18, point 2): the master serves the
// calls that carry a fresh token made with it and refuses the others, clients
// and nodes prove it, and a key file that will not do fails at start.
#include <grpcpp/grpcpp.h>

#include <atomic>

#include "integration/key_file.h"
#include "proto/store.grpc.pb.h"
#include "store/master/service.h"
#include "store/rpc/call_auth.h"
#include "store/rpc/master_client.h"
#include "store_cluster.h"

namespace ferry::test {
namespace {

namespace pb = ::ferry::store::v1;

constexpr char kSecret[] = "this cluster's secret: 32 bytes!";
constexpr char kOtherSecret[] = "another cluster's secret, as long";

StoreOptions WithKey(const std::string& key_file) {
  StoreOptions o;
  o.auth_key_file = key_file;
  o.rpc_timeout = Millis(5000);
  return o;
}

TEST(StoreAuth, ClientsAndNodesThatProveTheKeyAreServed) {
  KeyFile key("store", kSecret);
  ASSERT_TRUE(key.ok());
  auto master = cli::SpawnMaster(FerryBin(), {"--tick-ms", "20", "--auth-key-file", key.path()});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  auto node = cli::SpawnNode(
      FerryBin(), master.value().address,
      {"--segment-size", "16MiB", "--heartbeat-ms", "50", "--auth-key-file", key.path()});
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  // A pure client: the value goes to the node, through its engine, which
  // asks for the key too.
  auto s = Client(master.value().address, WithKey(key.path()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s.value()->Put("k", Pattern(100000, 1)).ok());
  auto got = s.value()->Get("k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), Pattern(100000, 1));
  EXPECT_EQ(Metric(master.value().http_port, "ferry_store_auth_failures_total"), 0);

  // A store with its own master and node in this process, the key from the
  // variable: its calls carry tokens its master accepts.
  setenv(auth::kKeyFileEnv, key.path().c_str(), 1);
  StoreOptions here;
  here.local_memory = 8 << 20;
  auto single = Store::Create(here);
  unsetenv(auth::kKeyFileEnv);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  ASSERT_TRUE(single.value()->Put("here", Pattern(1000, 2)).ok());
  EXPECT_TRUE(single.value()->Exists("here").ok());
}

TEST(StoreAuth, CallsWithoutTheKeyOrWithAnotherAreUnauthenticated) {
  KeyFile key("master", kSecret), other("master-other", kOtherSecret);
  ASSERT_TRUE(key.ok() && other.ok());
  auto master = cli::SpawnMaster(FerryBin(), {"--tick-ms", "20", "--auth-key-file", key.path()});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  const std::string& address = master.value().address;
  auto right = auth::LoadConfigured(key.path());
  auto wrong = auth::LoadConfigured(other.path());
  ASSERT_TRUE(right.ok() && wrong.ok());
  // One with the key mounts a node's region, so there is something to take.
  auto owner = store::MasterClient::Connect(address, Millis(5000), right.value());
  ASSERT_TRUE(owner.ok());
  ASSERT_TRUE(owner.value()->Mount({"127.0.0.1:1", 1, {{0x10000, 1 << 20}}, {}, false}).ok());
  int refused = 0;
  for (const auto& key_held : {std::shared_ptr<const auth::Key>(), wrong.value()}) {
    const char* who = key_held ? "another key" : "no key";
    auto c = store::MasterClient::Connect(address, Millis(5000), key_held);
    ASSERT_TRUE(c.ok());
    auto stats = c.value()->Stats();
    EXPECT_EQ(stats.status().code(), StatusCode::kUnauthenticated)
        << who << ": " << stats.status().ToString();
    // Nothing is granted: no space, and no unmount of another's node.
    auto put =
        c.value()->PutBegin({{"stolen", 4096, 1, "", StorePin::kNone, Millis(0)}}, "", false);
    EXPECT_EQ(put.status().code(), StatusCode::kUnauthenticated) << who;
    EXPECT_EQ(c.value()->Unmount("127.0.0.1:1").code(), StatusCode::kUnauthenticated) << who;
    // The Store API says the same.
    auto s = Client(address, WithKey(key_held ? other.path() : ""));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Status put_st = s.value()->Put("stolen", Pattern(10, 1));
    EXPECT_EQ(put_st.code(), StatusCode::kUnauthenticated) << who << ": " << put_st.ToString();
    refused += 4;
  }
  auto stats = owner.value()->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats.value().nodes, 1u) << "a refused Unmount was applied";
  EXPECT_EQ(stats.value().objects, 0u) << "a refused PutBegin was applied";
  EXPECT_GE(Metric(master.value().http_port, "ferry_store_auth_failures_total"), refused);

  // A node without the key is refused at once, and says why.
  auto node = cli::SpawnNode(FerryBin(), address, {"--segment-size", "16MiB"});
  EXPECT_FALSE(node.ok()) << "a node without the key mounted";
}

// The same token twice is a replay; a token is for one method and a limited
// time. Over the wire, through the generated stub, and at the checker itself.
TEST(StoreAuth, ReplayedStaleAndMisdirectedTokensAreRefused) {
  KeyFile key("tokens", kSecret), other("tokens-other", kOtherSecret);
  ASSERT_TRUE(key.ok() && other.ok());
  store::MasterServerOptions mo;
  mo.http_port = -1;
  mo.auth_key_file = key.path();
  auto server = store::MasterServer::Start(mo);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto k = auth::LoadConfigured(key.path());
  ASSERT_TRUE(k.ok());
  auto stub = pb::Master::NewStub(
      grpc::CreateChannel(server.value()->address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& token) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) ctx.AddMetadata(store::kTokenHeader, token);
    pb::StatsRequest req;
    pb::StatsResponse resp;
    return stub->Stats(&ctx, req, &resp).error_code();
  };
  auto token = store::MakeCallToken(*k.value(), "Stats");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(call(token.value()), grpc::StatusCode::OK);
  EXPECT_EQ(call(token.value()), grpc::StatusCode::UNAUTHENTICATED) << "a replay was served";
  EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(store::MakeCallToken(*k.value(), "Get").value()),
            grpc::StatusCode::UNAUTHENTICATED)
      << "another method's token was accepted";
  EXPECT_EQ(call("v1.garbage"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server.value()->auth_failures(), 4u);

  // The checker on its own, with the times it is given.
  store::CallTokenChecker checker(k.value());
  const auto now = store::WallClock::now();
  auto at = [&](store::WallClock::duration d) {
    return store::MakeCallToken(*k.value(), "Remove", now + d).value();
  };
  auto check = [&](const std::string& t, store::WallClock::time_point when) {
    const std::string_view v(t);
    return checker.Check("Remove", &v, when);
  };
  const std::string fresh = at({});
  EXPECT_TRUE(check(fresh, now).ok());
  Status st = check(fresh, now + std::chrono::seconds(1));
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(st.message().find("used before"), std::string::npos) << st.ToString();
  for (auto off : {-store::kTokenWindow - Millis(1), store::kTokenWindow + Millis(1)}) {
    st = check(at(off), now);
    EXPECT_EQ(st.code(), StatusCode::kUnauthenticated) << off.count();
    EXPECT_NE(st.message().find("clock"), std::string::npos) << st.ToString();
  }
  EXPECT_TRUE(check(at(store::kTokenWindow - Millis(1000)), now).ok()) << "skew within the window";
  // Long after it was first seen, a replay is stale instead.
  st = check(fresh, now + 3 * store::kTokenWindow);
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  auto w = auth::LoadConfigured(other.path());
  ASSERT_TRUE(w.ok());
  st = check(store::MakeCallToken(*w.value(), "Remove", now).value(), now);
  EXPECT_NE(st.message().find("does not verify"), std::string::npos) << st.ToString();
  for (const std::string& bad :
       {std::string(), std::string("v1"), std::string("v2.1.00.00"), std::string("v1.x.00.00"),
        fresh.substr(1), fresh.substr(0, fresh.size() - 1), fresh + "0"}) {
    EXPECT_EQ(check(bad, now).code(), StatusCode::kUnauthenticated) << bad;
  }
  EXPECT_EQ(checker.Check("Remove", nullptr, now).code(), StatusCode::kUnauthenticated);
}

// A client in the master's own process calls its service directly: no token
// to prove, but the gate and the master's checks of every item still apply,
// and over the network the same master still wants the secret.
TEST(StoreAuth, InProcessCallersNeedNoTokenButPassTheGateAndChecks) {
  KeyFile key("in-process", kSecret);
  ASSERT_TRUE(key.ok());
  std::atomic<bool> open{true};
  store::MasterServerOptions mo;
  mo.http_port = -1;
  mo.auth_key_file = key.path();
  mo.master.gate = [&] { return open ? Status::Ok() : Status::Unavailable("not the leader"); };
  auto server = store::MasterServer::Start(mo);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto local = store::MasterClient::Connect(server.value()->address(),
                                            server.value()->InProcessService(), Millis(5000));
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  auto stats = local.value()->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats.value().leader, server.value()->address());
  store::PutSpec empty, long_key;
  empty.key = "k";  // of size 0
  long_key.key = std::string(Store::kMaxKeyBytes + 1, 'k');
  long_key.size = 10;
  auto begun = local.value()->PutBegin({empty, long_key}, "", false);
  ASSERT_TRUE(begun.ok()) << begun.status().ToString();
  ASSERT_EQ(begun.value().size(), 2u);
  for (const auto& item : begun.value()) {
    EXPECT_EQ(item.status().code(), StatusCode::kInvalidArgument) << item.status().ToString();
  }
  open = false;
  auto refused = local.value()->Exists({"k"});
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  open = true;
  auto remote = store::MasterClient::Connect(server.value()->address(), Millis(5000));
  ASSERT_TRUE(remote.ok());
  EXPECT_EQ(remote.value()->Stats().status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(server.value()->auth_failures(), 1u);
}

TEST(StoreAuth, AMasterWithABadKeyFileDoesNotStart) {
  KeyFile loose("master-loose", kSecret, 0644), empty("master-empty", "");
  ASSERT_TRUE(loose.ok() && empty.ok());
  for (const std::string& file : {loose.path(), empty.path()}) {
    store::MasterServerOptions mo;
    mo.http_port = -1;
    mo.auth_key_file = file;
    auto server = store::MasterServer::Start(mo);
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << file;
    EXPECT_NE(server.status().message().find(file), std::string::npos)
        << server.status().ToString();
    auto spawned = cli::SpawnMaster(FerryBin(), {"--auth-key-file", file});
    EXPECT_FALSE(spawned.ok()) << "ferry master started with " << file;
    EXPECT_EQ(Client("127.0.0.1:1", WithKey(file)).status().code(), StatusCode::kInvalidArgument)
        << "a store started with " << file;
  }
}

}  // namespace
}  // namespace ferry::test
