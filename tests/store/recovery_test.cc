// A master rebuilt from its nodes' catalogs (issue 17, point 4), and the
// fencing term (point 3): real processes for the restart, in-process masters
// for the rules.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "store/master/master.h"
#include "store/master/service.h"
#include "store/node/catalog.h"
#include "store/rpc/master_client.h"
#include "store/store_cluster.h"

namespace ferry {
namespace {

using test::Client;
using test::Eventually;
using test::FerryBin;
using test::Metric;
using test::Pattern;

const std::vector<std::string> kMasterFlags = {"--node-ttl-ms", "2000", "--put-timeout-ms", "1000",
                                               "--lease-ms",    "500",  "--write-grace-ms", "100"};

Result<cli::MasterProcess> RestartMaster(cli::MasterProcess& m,
                                         std::vector<std::string> flags = kMasterFlags) {
  const std::string port = m.address.substr(m.address.rfind(':') + 1);
  (void)m.proc->Signal(SIGKILL);
  (void)m.proc->Wait(Millis(5000));
  flags.insert(flags.end(), {"--port", port, "--tick-ms", "20"});
  return cli::SpawnMaster(FerryBin(), flags);
}

std::string Key(const char* kind, int i) { return std::string(kind) + std::to_string(i); }

TEST(Recovery, ARestartedMasterGetsItsObjectsBackFromTheNodes) {
  auto c = test::StartCluster(2, "4MiB", kMasterFlags);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto& master = c.value().master;
  auto s = Client(master.address);
  ASSERT_TRUE(s.ok());
  PutOptions one, two;
  two.replicas = 2;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(s.value()->Put(Key("one", i), Pattern(100000 + i, i), one).ok());
    ASSERT_TRUE(s.value()->Put(Key("two", i), Pattern(50000 + i, 10 + i), two).ok());
  }
  // The nodes have listed every object.
  ASSERT_TRUE(
      Eventually([&] { return Metric(master.http_port, "ferry_store_catalog_pending") == 0; }));
  const int64_t old_term = Metric(master.http_port, "ferry_store_term");
  // A put being written at the kill: 3 MiB on each node, never committed.
  auto mc = store::MasterClient::Connect(master.address, Millis(5000));
  ASSERT_TRUE(mc.ok());
  auto begun =
      mc.value()->PutBegin({{"writing", 3 << 20, 2, "", StorePin::kNone, Millis(0)}}, "", false);
  ASSERT_TRUE(begun.ok() && begun.value()[0].ok());

  // Reads in flight across the restart: the right bytes or a clear error.
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, unclear{0}, served{0};
  std::thread reader([&, address = master.address] {
    auto r = Client(address);
    if (!r.ok()) return;
    for (int n = 0; !stop; ++n) {
      const int i = n % 4;
      auto got = r.value()->Get(Key("two", i));
      if (got.ok()) {
        ++served;
        if (got.value() != Pattern(50000 + i, 10 + i)) ++wrong;
        continue;
      }
      const StatusCode code = got.status().code();
      if (code != StatusCode::kUnavailable && code != StatusCode::kNotFound &&
          code != StatusCode::kTimeout && code != StatusCode::kPeerRestarted &&
          code != StatusCode::kConnectionLost) {
        ++unclear;
        ADD_FAILURE() << got.status().ToString();
      }
    }
  });

  // Served before the kill, and again after the restart.
  EXPECT_TRUE(Eventually([&] { return served.load() > 0; })) << "no read was served";
  const int before = served.load();
  auto again = RestartMaster(master);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  master = std::move(again).value();
  ASSERT_TRUE(Eventually([&] {
    auto st = s.value()->Stats();
    return st.ok() && st.value().nodes == 2 && st.value().objects == 8;
  })) << "the objects did not come back";
  EXPECT_TRUE(Eventually([&] { return served.load() > before; }))
      << "no read was served after the restart";
  stop = true;
  reader.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(unclear.load(), 0);
  auto st = s.value()->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_GT(static_cast<int64_t>(st.value().term), old_term);
  EXPECT_EQ(st.value().recovered_total, 12u);  // 4 + 2 x 4 replicas
  EXPECT_EQ(Metric(master.http_port, "ferry_store_recovered_objects_total"), 12);
  for (int i = 0; i < 4; ++i) {
    auto a = s.value()->Get(Key("one", i));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_TRUE(a.value() == Pattern(100000 + i, i)) << i;
    auto b = s.value()->Locate(Key("two", i));
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b.value().replicas.size(), 2u);
    auto g = s.value()->Get(Key("two", i));
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(g.value() == Pattern(50000 + i, 10 + i)) << i;
  }
  // The put being written is gone, and its space is free again (once the
  // old master's grants can no longer be writing it).
  EXPECT_EQ(s.value()->Exists("writing").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Eventually([&] { return s.value()->Put("big", Pattern(3 << 20, 7), two).ok(); }));
  ASSERT_TRUE(
      Eventually([&] { return Metric(master.http_port, "ferry_store_catalog_pending") == 0; }));

  // Node b never comes back: what had a replica on a survives.
  const std::string b = c.value().nodes[1].segment;
  ASSERT_TRUE(c.value().nodes[1].proc->Signal(SIGKILL).ok());
  auto third = RestartMaster(master);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  master = std::move(third).value();
  ASSERT_TRUE(Eventually([&] {
    auto x = s.value()->Stats();
    return x.ok() && x.value().nodes == 1 && x.value().recovered_total > 0;
  }));
  for (int i = 0; i < 4; ++i) {
    auto g = s.value()->Get(Key("two", i));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_TRUE(g.value() == Pattern(50000 + i, 10 + i)) << i;
    auto loc = s.value()->Locate(Key("one", i));
    if (loc.ok()) {
      EXPECT_NE(loc.value().replicas[0].extents[0].segment, b);
      auto a = s.value()->Get(Key("one", i));
      ASSERT_TRUE(a.ok());
      EXPECT_TRUE(a.value() == Pattern(100000 + i, i)) << i;
    } else {
      EXPECT_EQ(loc.status().code(), StatusCode::kNotFound);  // it lay on b
    }
  }
  auto big = s.value()->Get("big");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_TRUE(big.value() == Pattern(3 << 20, 7));
}

// Nodes heartbeat once a second: without catalog sync, the puts acknowledged
// in the last moments before the kill reach no node's catalog and are lost.
TEST(Recovery, WithCatalogSyncEveryAcknowledgedPutSurvivesAKillRightAfterIt) {
  std::vector<std::string> flags = {"--node-ttl-ms",     "6000", "--put-timeout-ms", "1000",
                                    "--lease-ms",        "500",  "--write-grace-ms", "100",
                                    "--catalog-sync-ms", "3000"};
  auto c = test::StartCluster(2, "4MiB", flags, /*heartbeat_ms=*/1000);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto& master = c.value().master;
  auto s = Client(master.address);
  ASSERT_TRUE(s.ok());
  PutOptions two;
  two.replicas = 2;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(s.value()->Put(Key("k", i), Pattern(20000 + i, i), two).ok());
  }
  EXPECT_EQ(Metric(master.http_port, "ferry_store_catalog_pending"), 0);
  EXPECT_EQ(Metric(master.http_port, "ferry_store_catalog_sync_timeouts_total"), 0);
  auto again = RestartMaster(master, flags);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  master = std::move(again).value();
  ASSERT_TRUE(Eventually([&] {
    auto st = s.value()->Stats();
    return st.ok() && st.value().nodes == 2 && st.value().recovered_total == 40;
  })) << "not every replica came back";
  for (int i = 0; i < 20; ++i) {
    auto g = s.value()->Get(Key("k", i));
    ASSERT_TRUE(g.ok()) << i << ": " << g.status().ToString();
    EXPECT_TRUE(g.value() == Pattern(20000 + i, i)) << i;
  }
}

// ---- the rules, on in-process masters ----

constexpr uint64_t kBase = 1ull << 30;

store::MasterOptions Term(uint64_t term) {
  store::MasterOptions o;
  o.term = term;
  o.put_timeout = Millis(300);
  o.lease = Millis(300);
  o.write_grace = Millis(0);
  return o;
}

// The catalog a node would hold after applying every change so far.
std::vector<store::CatalogEntry> CatalogOf(store::Master& m, const std::string& node) {
  auto changes = m.Heartbeat(node, 0);
  EXPECT_TRUE(changes.ok());
  std::map<std::string, store::CatalogEntry> held;
  for (const auto& c : changes.value()) {
    if (c.forget) {
      held.erase(c.entry.key);
    } else {
      held[c.entry.key] = c.entry;
    }
  }
  std::vector<store::CatalogEntry> out;
  for (auto& [k, e] : held) out.push_back(e);
  return out;
}

Status Commit(store::Master& m, const std::string& key, uint64_t size, uint32_t replicas) {
  auto g = m.PutBegin({key, size, replicas, "", StorePin::kNone, Millis(0)}, "");
  if (!g.ok()) return g.status();
  return m.PutEnd(key, g.value().put_id, true);
}

store::NodeMount MountOf(const std::string& node, std::vector<store::CatalogEntry> catalog,
                         bool resumed = true) {
  return {node, 7, {{kBase, 1 << 20}}, std::move(catalog), resumed};
}

TEST(Recovery, TheRebuiltMasterTakesOnlyEntriesThatAgree) {
  store::Master old(Term(1));
  ASSERT_TRUE(old.Mount(MountOf("a:1", {}, false)).ok());
  ASSERT_TRUE(old.Mount(MountOf("b:1", {}, false)).ok());
  ASSERT_TRUE(Commit(old, "x", 5000, 2).ok());
  ASSERT_TRUE(Commit(old, "gone", 5000, 2).ok());
  ASSERT_TRUE(old.Remove("gone", false).ok());
  auto a = CatalogOf(old, "a:1"), b = CatalogOf(old, "b:1");
  ASSERT_EQ(a.size(), 1u);  // "gone" was forgotten
  ASSERT_EQ(b.size(), 1u);

  store::Master m(Term(2));
  // a's catalog, with junk: a key this master's own term wrote (so it went),
  // an entry that overlaps x, and one outside the node's regions.
  auto mine = a[0];
  mine.key = "mine";
  mine.term = 2;
  auto overlap = a[0];
  overlap.key = "overlap";
  auto outside = a[0];
  outside.key = "outside";
  outside.extents = {{kBase + (2 << 20), 5000}};
  auto got = m.Mount(MountOf("a:1", {a[0], mine, overlap, outside}));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value().recovered, 1u);
  EXPECT_EQ(got.value().term, 2u);
  EXPECT_TRUE(m.Exists("x").ok());
  for (const char* k : {"mine", "overlap", "outside"}) EXPECT_FALSE(m.Exists(k).ok()) << k;
  // Each refused entry is forgotten by the node.
  auto forgets = m.Heartbeat("a:1", 0);
  ASSERT_TRUE(forgets.ok());
  EXPECT_EQ(forgets.value().size(), 3u);
  for (const auto& c : forgets.value()) EXPECT_TRUE(c.forget);
  // b joins x with the same put; a replica that disagrees on size does not.
  auto wrong_size = b[0];
  wrong_size.size = 4000;
  wrong_size.extents = {{wrong_size.extents[0].first, 4000}};
  EXPECT_EQ(m.Mount(MountOf("b:1", {wrong_size})).value().recovered, 0u);
  EXPECT_EQ(m.Get("x").value().location.replicas.size(), 1u);
  EXPECT_EQ(m.Mount(MountOf("b:1", {b[0]})).value().recovered, 1u);
  EXPECT_EQ(m.Get("x").value().location.replicas.size(), 2u);
  EXPECT_EQ(m.Stats().recovered_total, 2u);
  // Recovered space is taken, and only that.
  EXPECT_EQ(m.Stats().space.used, 2 * store::OffsetAllocator::RoundUp(5000));
}

TEST(Recovery, AResumedNodesFreeSpaceWaitsForTheOldGrants) {
  store::Master m(Term(2));
  ASSERT_TRUE(m.Mount(MountOf("a:1", {})).ok());  // resumed: fenced
  EXPECT_EQ(Commit(m, "k", 100, 1).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Eventually([&] { return Commit(m, "k", 100, 1).ok(); }));
}

// ---- catalog sync ----

store::MasterOptions Synced(Millis sync) {
  store::MasterOptions o = Term(1);
  o.catalog_sync = sync;
  return o;
}

TEST(CatalogSync, ACommitReturnsOnceEveryReplicasNodeAppliedItsEntry) {
  store::Master m(Synced(Millis(5000)));
  ASSERT_TRUE(m.Mount(MountOf("a:1", {}, false)).ok());
  ASSERT_TRUE(m.Mount(MountOf("b:1", {}, false)).ok());
  std::atomic<bool> done{false};
  Status committed;
  std::thread put([&] {
    committed = Commit(m, "k", 5000, 2);
    done = true;
  });
  // Each node's held heartbeat brings the entry; the commit waits for both acks.
  for (const char* node : {"a:1", "b:1"}) {
    auto got = m.Heartbeat(node, 0, true, Millis(2000));
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got.value().size(), 1u);
    EXPECT_EQ(got.value()[0].entry.key, "k");
    std::this_thread::sleep_for(Millis(100));
    EXPECT_FALSE(done.load()) << "the commit returned before " << node << " applied it";
    ASSERT_TRUE(m.Heartbeat(node, got.value()[0].seq, false).ok());
  }
  put.join();
  EXPECT_TRUE(committed.ok()) << committed.ToString();
  EXPECT_EQ(m.Stats().catalog_sync_timeouts, 0u);
  // A remove waits for the forgets the same way.
  done = false;
  std::thread rm([&] {
    committed = m.Remove("k", false);
    done = true;
  });
  for (const char* node : {"a:1", "b:1"}) {
    auto got = m.Heartbeat(node, 1, true, Millis(2000));
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got.value().size(), 1u);
    EXPECT_TRUE(got.value()[0].forget);
    std::this_thread::sleep_for(Millis(50));
    EXPECT_FALSE(done.load());
    ASSERT_TRUE(m.Heartbeat(node, 2, false).ok());
  }
  rm.join();
  EXPECT_TRUE(committed.ok()) << committed.ToString();
  EXPECT_EQ(m.Stats().catalog_sync_timeouts, 0u);
}

TEST(CatalogSync, ANodeThatNeverAppliesDelaysACommitByTheBoundOnly) {
  store::Master m(Synced(Millis(300)));
  ASSERT_TRUE(m.Mount(MountOf("a:1", {}, false)).ok());
  const auto start = Clock::now();
  EXPECT_TRUE(Commit(m, "k", 5000, 1).ok());
  const auto took = Clock::now() - start;
  EXPECT_GE(took, Millis(290));
  EXPECT_LT(took, Millis(3000));
  EXPECT_EQ(m.Stats().catalog_sync_timeouts, 1u);
  EXPECT_TRUE(m.Exists("k").ok());
  // A mount gone is not waited for: nobody will apply its changes.
  ASSERT_TRUE(m.Unmount("a:1").ok());
  ASSERT_TRUE(m.Mount(MountOf("a:1", {}, false)).ok());
  std::thread drop([&] {
    std::this_thread::sleep_for(Millis(50));
    (void)m.Unmount("a:1");
  });
  const auto second = Clock::now();
  (void)Commit(m, "j", 5000, 1);
  drop.join();
  EXPECT_LT(Clock::now() - second, Millis(280));
}

TEST(CatalogSync, AHeartbeatIsHeldUntilAChangeOrItsHoldAndNeverWithoutSync) {
  store::Master m(Synced(Millis(1000)));
  ASSERT_TRUE(m.Mount(MountOf("a:1", {}, false)).ok());
  auto start = Clock::now();
  auto idle = m.Heartbeat("a:1", 0, true, Millis(200));
  ASSERT_TRUE(idle.ok());
  EXPECT_TRUE(idle.value().empty());
  EXPECT_GE(Clock::now() - start, Millis(190));
  // A change answers a held heartbeat at once.
  std::thread put([&] { (void)Commit(m, "k", 5000, 1); });
  start = Clock::now();
  auto got = m.Heartbeat("a:1", 0, true, Millis(5000));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value().size(), 1u);
  EXPECT_LT(Clock::now() - start, Millis(2000));
  ASSERT_TRUE(m.Heartbeat("a:1", 1, false).ok());
  put.join();
  // Close ends a hold at once: a stopping server's calls return.
  std::thread closer([&] {
    std::this_thread::sleep_for(Millis(50));
    m.Close();
  });
  start = Clock::now();
  EXPECT_TRUE(m.Heartbeat("a:1", 1, true, Millis(1500)).ok());
  closer.join();
  EXPECT_LT(Clock::now() - start, Millis(1000));
  // Without sync, a hold asked for is not granted.
  store::Master plain(Term(1));
  ASSERT_TRUE(plain.Mount(MountOf("a:1", {}, false)).ok());
  start = Clock::now();
  EXPECT_TRUE(plain.Heartbeat("a:1", 0, true, Millis(1000)).ok());
  EXPECT_LT(Clock::now() - start, Millis(500));
}

// ---- the node's catalog ----

TEST(NodeCatalog, FollowsTheChangesInOrderAndDropsEntriesWhoseBytesChanged) {
  std::vector<uint8_t> mem(8192, 1);
  const auto base = reinterpret_cast<uint64_t>(mem.data());
  store::NodeCatalog cat([&](uint64_t addr, uint64_t len) {
    return addr >= base && len <= mem.size() && addr - base <= mem.size() - len;
  });
  auto entry = [&](const char* key, uint64_t off, uint64_t put_id) {
    return store::CatalogEntry{key, 1024,  {{base + off, 1024}}, StorePin::kNone, Millis(0),
                               1,   put_id};
  };
  // Out of order: refused, nothing applied.
  EXPECT_EQ(cat.Apply({{2, false, entry("a", 0, 1)}}).code(), StatusCode::kProtocolError);
  EXPECT_EQ(cat.size(), 0u);
  store::CatalogEntry outside = entry("out", 0, 9);
  outside.extents = {{base + (1 << 20), 1024}};
  ASSERT_TRUE(cat.Apply({{1, false, entry("a", 0, 1)},
                         {2, false, entry("b", 1024, 2)},
                         {3, false, outside},             // not this node's memory
                         {4, true, entry("b", 1024, 7)},  // another put of b: b stays
                         {5, false, entry("c", 2048, 3)},
                         {6, true, entry("c", 2048, 3)}})
                  .ok());
  EXPECT_EQ(cat.acked(), 6u);
  ASSERT_EQ(cat.size(), 2u);  // a and b
  // b's bytes are overwritten (its space reused): not reported any more.
  std::fill(mem.begin() + 1024, mem.begin() + 2048, 9);
  EXPECT_EQ(cat.Verify(), 1u);
  auto left = cat.Entries();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].key, "a");
  cat.Restart();  // a new mount: numbered from 1 again
  EXPECT_TRUE(cat.Apply({{1, true, entry("a", 0, 1)}}).ok());
  EXPECT_EQ(cat.size(), 0u);
}

// ---- fencing ----

TEST(Fencing, AnAnswerOfAnOlderTermIsRefused) {
  store::MasterServerOptions o;
  o.http_port = -1;
  o.master.term = 5;
  auto newer = store::MasterServer::Start(o);
  o.master.term = 3;
  auto older = store::MasterServer::Start(o);
  ASSERT_TRUE(newer.ok() && older.ok());
  auto fence = std::make_shared<store::TermFence>();
  auto to_newer =
      store::MasterClient::Connect(newer.value()->address(), Millis(5000), nullptr, fence);
  auto to_older =
      store::MasterClient::Connect(older.value()->address(), Millis(5000), nullptr, fence);
  ASSERT_TRUE(to_newer.ok() && to_older.ok());
  // Before the newer term is seen, the older master is served.
  ASSERT_TRUE(to_older.value()->Mount({"n:1", 1, {{kBase, 1 << 20}}, {}, false}).ok());
  ASSERT_TRUE(to_newer.value()->Mount({"n:1", 1, {{kBase, 1 << 20}}, {}, false}).ok());
  EXPECT_EQ(fence->highest(), 5u);
  // Now every answer of the older one is refused, grants included.
  std::vector<store::PutSpec> put = {{"k", 100, 1, "", StorePin::kNone, Millis(0)}};
  auto grant = to_older.value()->PutBegin(put, "", false);
  EXPECT_EQ(grant.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(grant.status().message().find("term 3"), std::string::npos)
      << grant.status().ToString();
  EXPECT_EQ(to_older.value()->Heartbeat("n:1", 0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(to_older.value()->Get({"k"}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(to_older.value()->Remove({"k"}, true).status().code(), StatusCode::kUnavailable);
  // The newer one is served.
  auto fine = to_newer.value()->PutBegin(put, "", false);
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_TRUE(fine.value()[0].ok());
}

TEST(Fencing, SetTermOnlyRaises) {
  store::Master m(Term(4));
  EXPECT_EQ(m.term(), 4u);
  EXPECT_TRUE(m.SetTerm(9).ok());
  EXPECT_EQ(m.SetTerm(8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.term(), 9u);
  EXPECT_EQ(m.Stats().term, 9u);
}

}  // namespace
}  // namespace ferry
