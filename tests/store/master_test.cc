// The master's policies through its own interface, with no network: two-phase
// puts, leases fencing removal and eviction, pins, eviction order and node loss.
#include "store/master/master.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "store/master/service.h"
#include "store/rpc/master_client.h"
#include "store_cluster.h"

namespace ferry::store {
namespace {

constexpr uint64_t kBase = 1ull << 30;

MasterOptions Fast() {
  MasterOptions o;
  o.lease = Millis(300);
  o.put_timeout = Millis(300);
  o.write_grace = Millis(0);
  o.node_ttl = Millis(60000);  // no heartbeats here, except where a test sends them
  o.tick = Millis(10);
  return o;
}

using test::Eventually;

Status Put(Master& m, const std::string& key, uint64_t size, uint32_t replicas = 1) {
  auto g = m.PutBegin({key, size, replicas, "", StorePin::kNone, Millis(0)}, "");
  if (!g.ok()) return g.status();
  Status st = m.PutEnd(key, g.value().put_id, true);
  // Each node catalogs the object at its next heartbeat, as a live one does.
  for (const auto& r : g.value().replicas) (void)m.Heartbeat(r.extents[0].segment, ~0ull);
  return st;
}

TEST(Master, APutIsInvisibleUntilCommittedAndAbortFreesIt) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 1 << 20}}).ok());
  auto g = m.PutBegin({"k", 1000, 1, "", StorePin::kNone, Millis(0)}, "");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(m.Exists("k").code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Get("k").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.PutBegin({"k", 1000, 1, "", StorePin::kNone, Millis(0)}, "").status().code(),
            StatusCode::kBusy);
  EXPECT_EQ(m.PutEnd("k", g.value().put_id + 1, true).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m.PutEnd("k", g.value().put_id, true).ok());
  EXPECT_TRUE(m.Exists("k").ok());
  EXPECT_EQ(m.PutBegin({"k", 1000, 1, "", StorePin::kNone, Millis(0)}, "").status().code(),
            StatusCode::kAlreadyExists);
  auto g2 = m.PutBegin({"j", 1000, 1, "", StorePin::kNone, Millis(0)}, "");
  ASSERT_TRUE(m.PutEnd("j", g2.value().put_id, false).ok());
  EXPECT_EQ(m.Exists("j").code(), StatusCode::kNotFound);
}

// A master elected with nodes on the roster is not sure of a miss until
// they have mounted again: Get, Exists, Remove and Pin say Unavailable, and
// name what they wait for; once every awaited node has mounted, NotFound.
TEST(Master, AMissIsUnsureUntilTheAwaitedNodesHaveMounted) {
  MasterOptions o = Fast();
  o.awaited_nodes = {"a:1", "b:1"};
  Master m(o);
  auto unsure = [&](const Status& st) {
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("rebuilding"), std::string::npos) << st.ToString();
  };
  unsure(m.Get("k").status());
  ASSERT_TRUE(m.Mount("a:1", 1, {{kBase, 1 << 20}}).ok());
  ASSERT_TRUE(Put(m, "here", 100).ok());  // what is known is served meanwhile
  EXPECT_TRUE(m.Get("here").ok());
  unsure(m.Get("k").status());
  unsure(m.Exists("k"));
  unsure(m.Remove("k", true));
  unsure(m.SetPin("k", StorePin::kSoft, Millis(1000)));
  EXPECT_NE(m.Get("k").status().message().find("b:1"), std::string::npos);
  ASSERT_TRUE(m.Mount("b:1", 1, {{kBase, 1 << 20}}).ok());
  EXPECT_EQ(m.Get("k").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Exists("k").code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Remove("k", true).code(), StatusCode::kNotFound);
}

// An awaited node that never mounts is waited for one node TTL at most: a
// node silent that long is gone.
TEST(Master, AnAwaitedNodeThatNeverMountsIsWaitedForOneNodeTtl) {
  MasterOptions o = Fast();
  o.node_ttl = Millis(50);
  o.awaited_nodes = {"gone:1"};
  Master m(o);
  EXPECT_EQ(m.Exists("k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Eventually([&] { return m.Exists("k").code() == StatusCode::kNotFound; }));
  EXPECT_EQ(m.Get("k").status().code(), StatusCode::kNotFound);
}

TEST(Master, AbandonedPutIsReclaimed) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 4096}}).ok());
  auto g = m.PutBegin({"k", 4096, 1, "", StorePin::kNone, Millis(0)}, "");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Eventually([&] { return m.Stats().puts_reclaimed == 1; }));
  EXPECT_EQ(m.PutEnd("k", g.value().put_id, true).code(), StatusCode::kNotFound);
  EXPECT_TRUE(Eventually([&] { return m.Stats().space.used == 0; }));
  EXPECT_TRUE(Put(m, "k", 4096).ok());  // the space is back
}

TEST(Master, LeaseRefusesRemoveUnlessForcedAndFencesTheSpace) {
  MasterOptions o = Fast();
  o.lease = Millis(2000);  // far longer than the few calls below take
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 4096}}).ok());
  ASSERT_TRUE(Put(m, "k", 4096).ok());
  auto g = m.Get("k");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(m.Remove("k", false).code(), StatusCode::kBusy);
  ASSERT_TRUE(m.Remove("k", true).ok());
  EXPECT_EQ(m.Exists("k").code(), StatusCode::kNotFound);
  // The leased bytes are not handed out again before the lease ends, and
  // nothing else is evictable: "no space" is the right answer now.
  EXPECT_EQ(m.PutBegin({"x", 4096, 1, "", StorePin::kNone, Millis(0)}, "").status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(m.Stats().deferred_bytes, 4096u);
  EXPECT_TRUE(Eventually([&] { return m.Stats().deferred_bytes == 0; }));
  EXPECT_TRUE(Put(m, "x", 4096).ok());
}

TEST(Master, ReleasedLeasesNoLongerFence) {
  MasterOptions o = Fast();
  o.lease = Millis(60000);
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 4096}}).ok());
  ASSERT_TRUE(Put(m, "k", 4096).ok());
  auto a = m.Get("k");
  auto b = m.Get("k");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a.value().lease_id, b.value().lease_id);
  ASSERT_TRUE(m.ReleaseLease("k", a.value().lease_id).ok());
  EXPECT_EQ(m.ReleaseLease("k", a.value().lease_id).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Remove("k", false).code(), StatusCode::kBusy);  // b still reads
  ASSERT_TRUE(m.ReleaseLease("k", b.value().lease_id).ok());
  ASSERT_TRUE(m.Remove("k", false).ok());
  EXPECT_TRUE(Put(m, "x", 4096).ok());  // the space was freed at once
}

TEST(Master, SyncEvictionTakesLeastRecentlyUsedAndSparesLeasedAndPinned) {
  MasterOptions o = Fast();
  o.lease = Millis(60000);
  o.high_watermark = 1.0;  // background eviction off: only allocation failures evict
  o.low_watermark = 1.0;
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 4 * 4096}}).ok());
  for (const char* k : {"a", "b", "c", "d"}) ASSERT_TRUE(Put(m, k, 4096).ok());
  ASSERT_TRUE(m.Get("a").ok());  // leased: never evicted
  ASSERT_TRUE(m.SetPin("b", StorePin::kHard, Millis(0)).ok());
  ASSERT_TRUE(m.SetPin("c", StorePin::kSoft, Millis(60000)).ok());
  // d is the only plain candidate; then the soft pin is the last resort.
  ASSERT_TRUE(Put(m, "e", 4096).ok());
  EXPECT_EQ(m.Exists("d").code(), StatusCode::kNotFound);
  EXPECT_TRUE(m.Exists("c").ok());
  ASSERT_TRUE(Put(m, "f", 4096).ok());  // evicts e (unpinned) before c
  EXPECT_EQ(m.Exists("e").code(), StatusCode::kNotFound);
  EXPECT_TRUE(m.Exists("c").ok());
  ASSERT_TRUE(m.SetPin("f", StorePin::kHard, Millis(0)).ok());
  ASSERT_TRUE(Put(m, "g", 4096).ok());  // only the soft pin is left
  EXPECT_EQ(m.Exists("c").code(), StatusCode::kNotFound);
  ASSERT_TRUE(m.SetPin("g", StorePin::kHard, Millis(0)).ok());
  // Nothing evictable remains: now, and only now, "no space".
  EXPECT_EQ(Put(m, "h", 4096).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m.Exists("a").ok());
  EXPECT_TRUE(m.Exists("b").ok());
}

TEST(Master, BackgroundEvictionBringsUsageUnderTheLowWatermark) {
  MasterOptions o = Fast();
  o.high_watermark = 0.5;
  o.low_watermark = 0.25;
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 8 * 4096}}).ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Put(m, fmt::format("k{}", i), 4096).ok());
  EXPECT_TRUE(Eventually([&] { return m.Stats().space.used <= 2 * 4096; }));
  EXPECT_TRUE(m.Exists("k7").ok());  // the most recent stays
  EXPECT_EQ(m.Exists("k0").code(), StatusCode::kNotFound);
}

TEST(Master, SilentNodeLosesItsReplicasAndLoneObjectsDisappear) {
  MasterOptions o = Fast();
  o.node_ttl = Millis(300);
  Master m(o);
  ASSERT_TRUE(m.Mount("a:1", 1, {{kBase, 1 << 20}}).ok());
  ASSERT_TRUE(m.Mount("b:1", 1, {{kBase, 1 << 20}}).ok());
  auto g = m.PutBegin({"both", 100, 2, "", StorePin::kNone, Millis(0)}, "");
  ASSERT_TRUE(g.ok() && m.PutEnd("both", g.value().put_id, true).ok());
  g = m.PutBegin({"on_a", 100, 1, "a:1", StorePin::kNone, Millis(0)}, "");
  ASSERT_TRUE(g.ok() && m.PutEnd("on_a", g.value().put_id, true).ok());
  ASSERT_EQ(g.value().replicas[0].extents[0].segment, "a:1");
  // b keeps heartbeating, a goes silent.
  EXPECT_TRUE(Eventually([&] {
    (void)m.Heartbeat("b:1");
    return m.Exists("on_a").code() == StatusCode::kNotFound;
  }));
  EXPECT_EQ(m.Heartbeat("a:1").code(), StatusCode::kNotFound);  // it must mount again
  auto both = m.Get("both");
  ASSERT_TRUE(both.ok());
  ASSERT_EQ(both.value().location.replicas.size(), 1u);
  EXPECT_EQ(both.value().location.replicas[0].extents[0].segment, "b:1");
}

// A master whose gate refuses (an elected one with etcd away) hears no
// heartbeats: a node is unmounted only once the master has served a whole
// TTL since the last refusal without hearing from it. The CI run of
// test_the_cluster_carries_on_after_etcd_restarts lost a cluster's keys to
// this: its leader unmounted both nodes while etcd was away, then served on.
TEST(Master, NodeTtlCountsOnlyWhileTheGateIsOpen) {
  std::atomic<bool> open{true};
  MasterOptions o = Fast();
  o.node_ttl = Millis(1000);  // the margin for this thread to be late
  o.gate = [&] { return open ? Status::Ok() : Status::Unavailable("not confirmed"); };
  Master m(o);
  ASSERT_TRUE(m.Mount("a:1", 1, {{kBase, 1 << 20}}).ok());
  ASSERT_TRUE(Put(m, "k", 100).ok());
  open = false;
  std::this_thread::sleep_for(Millis(1500));  // past the TTL with no heartbeat
  EXPECT_EQ(m.Gate().code(), StatusCode::kUnavailable);
  open = true;
  EXPECT_TRUE(m.Exists("k").ok());
  EXPECT_TRUE(m.Heartbeat("a:1").ok());
  EXPECT_EQ(m.Stats().nodes_expired, 0u);
  // Silent for a whole TTL of service, it goes.
  EXPECT_TRUE(Eventually([&] { return m.Exists("k").code() == StatusCode::kNotFound; }));
  EXPECT_EQ(m.Heartbeat("a:1").code(), StatusCode::kNotFound);
}

// Likewise a miss waits for the awaited nodes a whole TTL of service.
TEST(Master, AwaitedNodesAreWaitedForOneTtlOfService) {
  std::atomic<bool> open{false};
  MasterOptions o = Fast();
  o.node_ttl = Millis(1000);
  o.awaited_nodes = {"slow:1"};
  o.gate = [&] { return open ? Status::Ok() : Status::Unavailable("not confirmed"); };
  Master m(o);
  std::this_thread::sleep_for(Millis(1500));
  EXPECT_EQ(m.Gate().code(), StatusCode::kUnavailable);
  open = true;
  EXPECT_EQ(m.Exists("k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Eventually([&] { return m.Exists("k").code() == StatusCode::kNotFound; }));
}

// The service records the refusals it makes, not only the tick: with no
// tick in the test, a call refused after the awaited nodes' window had run
// out (counted from the start) opens it again for a TTL of service.
TEST(Master, ACallTheServiceRefusedRestartsTheTtl) {
  std::atomic<bool> open{false};
  MasterServerOptions so;
  so.http_port = -1;
  so.master = Fast();
  so.master.tick = Millis(3600 * 1000);
  so.master.node_ttl = Millis(1000);
  so.master.awaited_nodes = {"slow:1"};
  so.master.gate = [&] { return open ? Status::Ok() : Status::Unavailable("not confirmed"); };
  auto server = MasterServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = MasterClient::Connect(server.value()->address(), server.value()->InProcessService(),
                                      Millis(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::this_thread::sleep_for(Millis(1500));
  EXPECT_EQ(client.value()->Exists({"k"}).status().code(), StatusCode::kUnavailable);
  open = true;
  auto after = client.value()->Exists({"k"});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_EQ(after.value().size(), 1u);
  EXPECT_EQ(after.value()[0].code(), StatusCode::kUnavailable) << after.value()[0].ToString();
}

PutSpec Reserve(uint64_t size) {
  PutSpec s{"", size, 1, "", StorePin::kNone, Millis(0)};
  s.reserve = true;
  return s;
}

TEST(Master, AReservationBecomesTheObjectItsCommitNames) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 1 << 20}}).ok());
  auto r = m.PutBegin(Reserve(1000), "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(m.Stats().objects, 0u);  // space, not an object
  EXPECT_EQ(m.Stats().space.used, 1024u);
  ASSERT_TRUE(m.PutEnd("k", r.value().put_id, true, /*reserved=*/true).ok());
  ASSERT_TRUE(m.Exists("k").ok());
  auto got = m.Get("k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value().location.size, 1000u);
  EXPECT_EQ(got.value().location.replicas[0].extents[0].addr,
            r.value().replicas[0].extents[0].addr);
  // Ended by its commit: the id names nothing now, reserved or not.
  EXPECT_EQ(m.PutEnd("j", r.value().put_id, true, true).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.PutEnd("k", r.value().put_id, true).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Stats().reserved, 1u);
  EXPECT_EQ(m.Stats().reserved_committed, 1u);
}

TEST(Master, BadReservationsAndCommitsAreRefusedAndLoseNothing) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 1 << 20}}).ok());
  PutSpec keyed{"k", 1000, 1, "", StorePin::kNone, Millis(0)};
  keyed.reserve = true;
  EXPECT_EQ(m.PutBegin(keyed, "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.PutBegin({"", 1000, 1, "", StorePin::kNone, Millis(0)}, "").status().code(),
            StatusCode::kInvalidArgument);  // an empty key needs reserve
  EXPECT_EQ(m.PutBegin(Reserve(0), "").status().code(), StatusCode::kInvalidArgument);
  auto r = m.PutBegin(Reserve(1000), "");
  ASSERT_TRUE(r.ok());
  const uint64_t id = r.value().put_id;
  EXPECT_EQ(m.PutEnd("k", id + 1, true, true).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.PutEnd("", id, true, true).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.PutEnd(std::string(Master::kMaxKeyBytes + 1, 'x'), id, true, true).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.PutEnd("k", id, true, /*reserved=*/false).code(), StatusCode::kNotFound);
  // None of those ended it.
  ASSERT_TRUE(m.PutEnd("k", id, true, true).ok());
  EXPECT_TRUE(m.Exists("k").ok());
}

TEST(Master, AReservationNamingATakenKeyFailsAndFreesItsSpace) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 1 << 20}}).ok());
  ASSERT_TRUE(Put(m, "k", 1000).ok());
  auto open = m.PutBegin({"busy", 1000, 1, "", StorePin::kNone, Millis(0)}, "");
  ASSERT_TRUE(open.ok());
  const uint64_t used = m.Stats().space.used;
  auto r = m.PutBegin(Reserve(1000), "");
  auto r2 = m.PutBegin(Reserve(1000), "");
  ASSERT_TRUE(r.ok() && r2.ok());
  EXPECT_EQ(m.PutEnd("k", r.value().put_id, true, true).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(m.PutEnd("busy", r2.value().put_id, true, true).code(), StatusCode::kBusy);
  EXPECT_EQ(m.PutEnd("k2", r.value().put_id, true, true).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Stats().space.used, used);  // both freed (write grace 0 here)
  EXPECT_EQ(m.Stats().objects, 2u);
  ASSERT_TRUE(m.PutEnd("busy", open.value().put_id, true).ok());
}

TEST(Master, AnAbortedOrAbandonedReservationIsFreed) {
  MasterOptions o = Fast();
  o.high_watermark = 1.0;  // a reservation may fill the node
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 4096}}).ok());
  auto r = m.PutBegin(Reserve(4096), "");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(m.PutEnd("", r.value().put_id, false, true).ok());  // no key needed to end one
  EXPECT_EQ(m.Stats().space.used, 0u);
  r = m.PutBegin(Reserve(4096), "");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(Eventually([&] { return m.Stats().puts_reclaimed == 1; }));
  EXPECT_EQ(m.PutEnd("k", r.value().put_id, true, true).code(), StatusCode::kNotFound);
  EXPECT_TRUE(Eventually([&] { return m.Stats().space.used == 0; }));
  EXPECT_TRUE(Put(m, "k", 4096).ok());
}

TEST(Master, AReservationEvictsNothingWhereAPutWould) {
  MasterOptions o = Fast();
  o.high_watermark = 1.0;  // only allocation failures evict
  o.low_watermark = 1.0;
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 2 * 4096}}).ok());
  ASSERT_TRUE(Put(m, "a", 4096).ok());
  ASSERT_TRUE(Put(m, "b", 4096).ok());
  EXPECT_EQ(m.PutBegin(Reserve(4096), "").status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m.Exists("a").ok());
  EXPECT_TRUE(m.Exists("b").ok());
  EXPECT_TRUE(Put(m, "c", 4096).ok());  // a put evicts
}

TEST(Master, AReservationStaysUnderTheHighWatermark) {
  MasterOptions o = Fast();
  o.high_watermark = 0.5;
  o.low_watermark = 0.25;
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 8 * 4096}}).ok());
  ASSERT_TRUE(Put(m, "a", 2 * 4096).ok());
  ASSERT_TRUE(m.PutBegin(Reserve(2 * 4096), "").ok());  // 4 of 8 pages: at the mark
  EXPECT_EQ(m.PutBegin(Reserve(64), "").status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m.Exists("a").ok());
}

TEST(Master, ReservationsGoBeforeObjectsAboveTheHighWatermark) {
  MasterOptions o = Fast();
  o.high_watermark = 0.75;
  o.low_watermark = 0.5;
  Master m(o);
  ASSERT_TRUE(m.Mount("n:1", 1, {{kBase, 8 * 4096}}).ok());
  ASSERT_TRUE(Put(m, "a", 3 * 4096).ok());
  auto r = m.PutBegin(Reserve(3 * 4096), "");  // 6 of 8 pages: at the mark
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Put(m, "b", 4096).ok());  // 7 of 8: the next tick evicts
  EXPECT_TRUE(Eventually([&] { return m.Stats().space.used <= 4 * 4096; }));
  EXPECT_TRUE(m.Exists("a").ok());
  EXPECT_TRUE(m.Exists("b").ok());
  EXPECT_EQ(m.PutEnd("k", r.value().put_id, true, true).code(), StatusCode::kNotFound);
}

TEST(Master, AReservationOnALostNodeIsGone) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("a:1", 1, {{kBase, 1 << 20}}).ok());
  ASSERT_TRUE(m.Mount("b:1", 1, {{kBase, 1 << 20}}).ok());
  PutSpec two = Reserve(100);
  two.replicas = 2;
  auto r = m.PutBegin(two, "");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(m.Unmount("a:1").ok());
  // All or nothing: its replica on b is freed too.
  EXPECT_EQ(m.PutEnd("k", r.value().put_id, true, true).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Stats().space.used, 0u);
}

TEST(Master, MetricsText) {
  Master m(Fast());
  ASSERT_TRUE(m.Mount("a:1", 1, {{kBase, 1 << 20}}).ok());
  ASSERT_TRUE(Put(m, "k", 100).ok());
  std::string t = MetricsText(m.Stats());
  EXPECT_NE(t.find("ferry_store_nodes 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("ferry_store_objects 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE ferry_store_puts_committed_total counter"), std::string::npos);
}

}  // namespace
}  // namespace ferry::store
