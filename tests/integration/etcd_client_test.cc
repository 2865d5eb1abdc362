// The etcd client (coord/) against a real etcd process: KV and transactions,
// several endpoints, leases and their keep-alive, watches across a restart
// of etcd, and bad input.
#include "coord/etcd_client.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "coord/etcd_url.h"
#include "coord/etcd_watch.h"
#include "coord/lease_keeper.h"
#include "integration/etcd_server.h"
#include "integration/peer.h"

namespace ferry::coord {
namespace {

using std::chrono::seconds;

std::shared_ptr<EtcdClient> Client(std::vector<std::string> endpoints,
                                   Millis timeout = Millis(2000)) {
  auto c = EtcdClient::Create({std::move(endpoints), timeout});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? c.value() : nullptr;
}

// A port nobody listens on.
std::string DeadEndpoint() {
  uint16_t port = 0;
  int fd = test::ListenOnLoopback(&port);
  close(fd);
  return "127.0.0.1:" + std::to_string(port);
}

// What a watch delivered, for a test to wait on.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchEvent> events;
  int resyncs = 0;

  EtcdWatch::Callback Fn() {
    return [this](const WatchUpdate& up) {
      std::lock_guard lk(mu);
      if (up.resync) ++resyncs;
      events.insert(events.end(), up.events.begin(), up.events.end());
      cv.notify_all();
    };
  }
  bool WaitFor(size_t n, seconds timeout = seconds(10)) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, [&] { return events.size() >= n; });
  }
};

// A fresh etcd and a client of it for each test; skipped without etcd.
class EtcdClientLive : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_ETCD();
    auto etcd = test::EtcdServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(etcd).value();
    c_ = Client({etcd_->endpoint()});
  }
  std::unique_ptr<test::EtcdServer> etcd_;
  std::shared_ptr<EtcdClient> c_;
};

TEST(EtcdUrl, ParsesEndpointsAndCluster) {
  auto u = ParseEtcdUrl("etcd://127.0.0.1:2379,10.0.0.2:2380/prod-1");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u.value().endpoints, (std::vector<std::string>{"127.0.0.1:2379", "10.0.0.2:2380"}));
  EXPECT_EQ(u.value().cluster, "prod-1");
  auto v6 = ParseEtcdUrl("etcd://[::1]:2379,etcd-0.example:2379/c");
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6.value().endpoints[0], "[::1]:2379");
}

TEST(EtcdUrl, RefusesMalformedStringsClearly) {
  struct Case {
    const char* url;
    const char* says;
  };
  for (const Case& c :
       {Case{"http://127.0.0.1:2379/c", "is not etcd://"},
        Case{"etcd://127.0.0.1:2379", "names no cluster"},
        Case{"etcd://127.0.0.1:2379/", "cluster name"}, Case{"etcd:///c", "no etcd endpoint"},
        Case{"etcd://127.0.0.1/c", "is not host:port"},
        Case{"etcd://127.0.0.1:0/c", "no port in 1..65535"},
        Case{"etcd://127.0.0.1:99999/c", "no port in 1..65535"},
        Case{"etcd://127.0.0.1:2379,/c", "is empty"},
        Case{"etcd://h:1/a/b", "only letters, digits"},
        Case{"etcd://::1:2379/c", "malformed host"}}) {
    auto u = ParseEtcdUrl(c.url);
    ASSERT_FALSE(u.ok()) << c.url;
    EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument) << c.url;
    EXPECT_NE(u.status().message().find(c.says), std::string::npos)
        << c.url << ": " << u.status().message();
  }
  EXPECT_FALSE(IsEtcdUrl("p2p"));
  EXPECT_TRUE(IsEtcdUrl("etcd://x"));
}

TEST(EtcdClient, RefusesBadOptionsAndInput) {
  EXPECT_EQ(EtcdClient::Create({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({{"no-port"}, Millis(100)}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({{"127.0.0.1:1"}, Millis(0)}).status().code(),
            StatusCode::kInvalidArgument);
  auto c = Client({"127.0.0.1:1"});
  EXPECT_EQ(c->Put("", "v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->LeaseGrant(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdWatch::Start(c, "", false, 0, [](const WatchUpdate&) {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientLive, KeysAndTransactions) {
  auto& c = c_;

  auto none = c->Get("/t/a");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none.value().has_value());
  auto rev = c->Put("/t/a", std::string("1\0x", 3));
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  ASSERT_TRUE(c->Put("/t/b", "2").ok());
  ASSERT_TRUE(c->Put("/u", "3").ok());
  auto a = c->Get("/t/a");
  ASSERT_TRUE(a.ok() && a.value().has_value());
  EXPECT_EQ(a.value()->value, std::string("1\0x", 3));  // values are bytes
  EXPECT_EQ(a.value()->mod_revision, rev.value());
  auto range = c->GetPrefix("/t/");
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range.value().kvs.size(), 2u);
  EXPECT_EQ(range.value().kvs[1].key, "/t/b");

  // Create-if-absent: once only, and the loser learns the winner.
  auto created = c->CreateIfAbsent("/t/leader", "m1");
  ASSERT_TRUE(created.ok() && created.value());
  std::optional<KeyValue> holder;
  created = c->CreateIfAbsent("/t/leader", "m2", 0, &holder);
  ASSERT_TRUE(created.ok());
  EXPECT_FALSE(created.value());
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(holder->value, "m1");

  // Compare-and-swap on the mod revision, then on the value.
  auto swapped = c->CompareAndSwap("/t/leader", holder->mod_revision + 100, "m3");
  ASSERT_TRUE(swapped.ok());
  EXPECT_FALSE(swapped.value());
  swapped = c->CompareAndSwap("/t/leader", holder->mod_revision, "m3");
  ASSERT_TRUE(swapped.ok() && swapped.value());
  EXPECT_FALSE(c->CompareValueAndSwap("/t/leader", "m1", "m4").value());
  EXPECT_TRUE(c->CompareValueAndSwap("/t/leader", "m3", "m4").value());
  EXPECT_EQ(c->Get("/t/leader").value()->value, "m4");
  EXPECT_TRUE(c->CompareAndSwap("/t/fresh", 0, "x").value());  // 0: only if absent
  EXPECT_FALSE(c->CompareAndSwap("/t/fresh", 0, "y").value());

  // A transaction's reads come back in order.
  auto t = c->Txn({Compare::Absent("/t/nothing")}, {TxnOp::Get("/t/", true), TxnOp::Get("/u")});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t.value().succeeded);
  ASSERT_EQ(t.value().reads.size(), 2u);
  EXPECT_EQ(t.value().reads[0].kvs.size(), 4u);
  EXPECT_EQ(t.value().reads[1].kvs.at(0).value, "3");

  const int64_t now = c->Get("/t/leader").value()->mod_revision;
  EXPECT_FALSE(c->CompareAndDelete("/t/leader", now - 1).value());
  EXPECT_TRUE(c->CompareAndDelete("/t/leader", now).value());
  EXPECT_EQ(c->Delete("/t/", true).value(), 3);
  EXPECT_EQ(c->Delete("/u").value(), 1);
  EXPECT_EQ(c->Delete("/u").value(), 0);
}

TEST_F(EtcdClientLive, MovesPastADeadEndpointAndNamesAllWhenNoneAnswers) {
  const std::string dead = DeadEndpoint();
  auto c = Client({dead, etcd_->endpoint()});
  ASSERT_TRUE(c->Put("/k", "v").ok());
  EXPECT_EQ(c->current_endpoint(), etcd_->endpoint());
  EXPECT_EQ(c->Get("/k").value()->value, "v");

  auto none = Client({dead, DeadEndpoint()}, Millis(500));
  auto r = none->Get("/k");
  ASSERT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find(dead), std::string::npos) << r.status().message();
}

TEST_F(EtcdClientLive, ALeaseNotKeptAliveExpiresWithItsKeys) {
  auto& c = c_;
  auto lease = c->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(c->Put("/leased", "v", lease.value().id).ok());
  EXPECT_EQ(c->Get("/leased").value()->lease, lease.value().id);
  auto ttl = c->LeaseTimeToLive(lease.value().id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GT(ttl.value(), 0);

  const Deadline deadline = Deadline::After(seconds(lease.value().ttl_seconds + 10));
  while (c->Get("/leased").value().has_value() && !deadline.Expired()) {
    std::this_thread::sleep_for(Millis(100));
  }
  EXPECT_FALSE(c->Get("/leased").value().has_value());
  EXPECT_EQ(c->LeaseTimeToLive(lease.value().id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->LeaseKeepAliveOnce(lease.value().id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->Put("/again", "v", lease.value().id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->LeaseRevoke(lease.value().id).code(), StatusCode::kNotFound);
}

TEST_F(EtcdClientLive, TheKeeperHoldsALeasePastItsTtlAndReportsItsLoss) {
  auto& c = c_;
  auto lease = c->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(c->Put("/kept", "v", lease.value().id).ok());
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> lost;
  LeaseKeeper keeper(c, lease.value(), [&](const Status& st) {
    std::lock_guard lk(mu);
    lost = st;
    cv.notify_all();
  });
  std::this_thread::sleep_for(seconds(lease.value().ttl_seconds * 2));
  EXPECT_TRUE(c->Get("/kept").value().has_value());  // renewed past its TTL
  EXPECT_FALSE(keeper.lost());

  ASSERT_TRUE(c->LeaseRevoke(lease.value().id).ok());  // someone else ends it
  std::unique_lock lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, seconds(10), [&] { return lost.has_value(); }));
  EXPECT_EQ(lost->code(), StatusCode::kNotFound) << lost->ToString();
  EXPECT_TRUE(keeper.lost());
}

TEST_F(EtcdClientLive, AWatchSeesChangesInOrderAndResumesAfterEtcdRestarts) {
  auto c = Client({etcd_->endpoint()}, Millis(1000));
  ASSERT_TRUE(c->Put("/w/before", "0").ok());  // before the watch: not seen
  Seen seen;
  auto w = EtcdWatch::Start(c, "/w/", true, 0, seen.Fn());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(c->Put("/w/a", "1").ok());
  ASSERT_TRUE(c->Put("/other", "x").ok());  // outside the prefix
  ASSERT_TRUE(c->Delete("/w/a").ok());
  ASSERT_TRUE(seen.WaitFor(2));

  ASSERT_TRUE(etcd_->Restart().ok());
  // The client's calls and the watch come back by themselves.
  const Deadline deadline = Deadline::After(seconds(20));
  Result<int64_t> put = Status::Internal("unset");
  while (!(put = c->Put("/w/b", "2")).ok() && !deadline.Expired()) {
    std::this_thread::sleep_for(Millis(100));
  }
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  ASSERT_TRUE(seen.WaitFor(3, seconds(20)));
  std::this_thread::sleep_for(Millis(200));  // nothing repeated after it
  std::lock_guard lk(seen.mu);
  ASSERT_EQ(seen.events.size(), 3u);
  EXPECT_EQ(seen.events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(seen.events[0].kv.key, "/w/a");
  EXPECT_EQ(seen.events[0].kv.value, "1");
  EXPECT_EQ(seen.events[1].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(seen.events[1].kv.key, "/w/a");
  EXPECT_EQ(seen.events[2].kv.key, "/w/b");
  EXPECT_EQ(seen.events[2].kv.mod_revision, put.value());
  EXPECT_GE(w.value()->reconnects(), 1u);
  EXPECT_EQ(w.value()->revision(), put.value());
}

TEST_F(EtcdClientLive, AWatchFromAPastRevisionReplaysWhatFollowedIt) {
  auto& c = c_;
  auto first = c->Put("/r/x", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(c->Put("/r/x", "2").ok());
  Seen seen;
  auto w = EtcdWatch::Start(c, "/r/x", false, first.value(), seen.Fn());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(seen.WaitFor(2));
  std::lock_guard lk(seen.mu);
  EXPECT_EQ(seen.events[0].kv.value, "1");
  EXPECT_EQ(seen.events[1].kv.value, "2");
}

TEST(EtcdClient, AWatchWithNoEtcdFailsAtStart) {
  auto c = Client({DeadEndpoint()}, Millis(300));
  auto w = EtcdWatch::Start(c, "/k", false, 0, [](const WatchUpdate&) {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kUnavailable) << w.status().ToString();
}

}  // namespace
}  // namespace ferry::coord
