// The store end to end: `ferry master` and `ferry node` processes on loopback,
// and ferry::Store clients in this process.
#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <set>
#include <thread>

#include "store/client/testing.h"
#include "store/rpc/master_client.h"
#include "store_cluster.h"

namespace ferry::test {
namespace {

TEST(Store, RoundTripsAtManySizes) {
  auto c = StartCluster(2, "64MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  std::vector<uint64_t> sizes = {
      1, 7, 63, 64, 65, 4095, 4096, 4097, 100000, 1 << 20, (1 << 20) + 3, 16 << 20};
  for (uint64_t n : sizes) {
    const std::string key = fmt::format("size/{}", n);
    auto v = Pattern(n, n);
    ASSERT_TRUE(store.Put(key, v).ok()) << n;
    auto got = store.Get(key);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status().ToString();
    EXPECT_EQ(got.value(), v) << n;
  }
  // Zero copy on registered buffers, in one batch.
  std::vector<uint8_t> src(8 << 20), dst(8 << 20, 0);
  FillRandom(src.data(), src.size(), 99);
  ASSERT_TRUE(store.RegisterBuffer(src.data(), src.size()).ok());
  ASSERT_TRUE(store.RegisterBuffer(dst.data(), dst.size()).ok());
  std::vector<std::string> keys;
  std::vector<StoreBuffer> in, out;
  for (int i = 0; i < 8; ++i) {
    keys.push_back(fmt::format("zc/{}", i));
    in.push_back({src.data() + (i << 20), 1 << 20});
    out.push_back({dst.data() + (i << 20), 1 << 20});
  }
  for (const auto& st : store.BatchPutFrom(keys, in)) ASSERT_TRUE(st.ok()) << st.ToString();
  for (const auto& r : store.BatchGetInto(keys, out)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r.value(), 1u << 20);
  }
  EXPECT_EQ(src, dst);
  for (const auto& st : store.BatchExists(keys)) EXPECT_TRUE(st.ok());
  // The gets released their leases when done: a plain remove goes through.
  for (const auto& st : store.BatchRemove(keys)) EXPECT_TRUE(st.ok()) << st.ToString();
  for (const auto& st : store.BatchExists(keys)) EXPECT_EQ(st.code(), StatusCode::kNotFound);
}

TEST(Store, ReplicasLandOnDistinctNodes) {
  auto c = StartCluster(3, "16MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  PutOptions po;
  po.replicas = 3;
  for (int i = 0; i < 10; ++i) {
    const std::string key = fmt::format("r/{}", i);
    ASSERT_TRUE(s.value()->Put(key, Pattern(100000, i), po).ok());
    auto loc = s.value()->Locate(key);
    ASSERT_TRUE(loc.ok());
    std::set<std::string> segs;
    for (const auto& r : loc.value().replicas) segs.insert(r.extents[0].segment);
    EXPECT_EQ(segs.size(), 3u);
  }
  po.replicas = 4;
  EXPECT_EQ(s.value()->Put("r/too-many", Pattern(10, 1), po).code(), StatusCode::kUnavailable);
  // A preferred segment gets the first copy.
  PutOptions pref;
  pref.preferred_segment = c.value().nodes[2].segment;
  ASSERT_TRUE(s.value()->Put("r/pref", Pattern(1000, 1), pref).ok());
  auto loc = s.value()->Locate("r/pref");
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc.value().replicas[0].extents[0].segment, c.value().nodes[2].segment);
}

TEST(Store, EvictionKeepsPutsSucceedingUnderMemoryPressure) {
  // 2 x 8 MiB of node memory; 48 MiB of puts.
  auto c = StartCluster(2, "8MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 48; ++i) {
    Status st = s.value()->Put(fmt::format("p/{}", i), Pattern(1 << 20, i));
    ASSERT_TRUE(st.ok()) << i << ": " << st.ToString();
  }
  EXPECT_EQ(s.value()->Exists("p/0").code(), StatusCode::kNotFound);  // evicted, oldest first
  auto last = s.value()->Get("p/47");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last.value(), Pattern(1 << 20, 47));
  // Whatever survived is intact.
  for (int i = 0; i < 48; ++i) {
    auto g = s.value()->Get(fmt::format("p/{}", i));
    if (g.ok()) {
      EXPECT_EQ(g.value(), Pattern(1 << 20, i)) << i;
    } else {
      EXPECT_EQ(g.status().code(), StatusCode::kNotFound) << g.status().ToString();
    }
  }
}

// A slow reader: the lookup grants a lease, the reader sleeps, and meanwhile
// the key is force-removed and the memory refilled with other values. The
// read never returns another value: while the lease outlasts the reader it
// returns the original bytes, and once the lease has ended it fails with
// Timeout.
void SlowReader(Millis lease, Millis delay, bool lease_outlasts_reader) {
  auto c = StartCluster(1, "4MiB",
                        {"--lease-ms", std::to_string(lease.count()), "--write-grace-ms", "0"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto writer = Client(c.value().master.address);
  ASSERT_TRUE(writer.ok());
  StoreOptions ro;
  ro.master = c.value().master.address;
  ro.local_memory = 0;
  auto reader = store::testing::CreateWithReadDelay(ro, delay);
  ASSERT_TRUE(reader.ok());
  const auto original = Pattern(1 << 20, 1);
  ASSERT_TRUE(writer.value()->Put("victim", original).ok());
  Result<std::vector<uint8_t>> got = Status::Internal("not run");
  std::atomic<bool> started{false};
  std::thread t([&] {
    started = true;
    got = reader.value()->Get("victim");
  });
  while (!started) std::this_thread::yield();
  // Wait until the reader holds its lease; a plain remove is then refused.
  ASSERT_TRUE(Eventually(
      [&] { return Metric(c.value().master.http_port, "ferry_store_gets_total") == 1; }));
  if (lease_outlasts_reader) {
    EXPECT_EQ(writer.value()->Remove("victim").code(), StatusCode::kBusy);
  }
  ASSERT_TRUE(writer.value()->Remove("victim", /*force=*/true).ok());
  // With a short lease, refill only once it has ended, so that the victim's
  // bytes are really reused under the sleeping reader.
  if (!lease_outlasts_reader) std::this_thread::sleep_for(lease + Millis(200));
  // Refill all memory with other values while the reader sleeps.
  for (int i = 0; i < 8; ++i) {
    (void)writer.value()->Put(fmt::format("other/{}", i), Pattern(1 << 20, 1000 + i));
  }
  t.join();
  if (lease_outlasts_reader) {
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got.value(), original) << "a read returned bytes of another object";
  } else {
    EXPECT_EQ(got.status().code(), StatusCode::kTimeout)
        << (got.ok() ? "a read outliving its lease returned bytes" : got.status().ToString());
  }
}

TEST(Store, SlowReadUnderLeaseReturnsIntactData) { SlowReader(Millis(3000), Millis(600), true); }

TEST(Store, ReadOutlivingItsLeaseFailsClearly) { SlowReader(Millis(300), Millis(1500), false); }

TEST(Store, KilledNodeObjectsDisappearWithinTheTtl) {
  auto c = StartCluster(2, "16MiB", {"--node-ttl-ms", "500"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  PutOptions on0, on1;
  on0.preferred_segment = c.value().nodes[0].segment;
  on1.preferred_segment = c.value().nodes[1].segment;
  ASSERT_TRUE(s.value()->Put("doomed", Pattern(100000, 1), on1).ok());
  ASSERT_TRUE(s.value()->Put("safe", Pattern(100000, 2), on0).ok());
  ASSERT_TRUE(c.value().nodes[1].proc->Signal(SIGKILL).ok());
  // A get before the master notices returns the bytes (shm keeps a dead
  // peer's memory mapped), fails, or reports not-found; it never hangs.
  auto early = s.value()->Get("doomed");
  if (early.ok()) {
    EXPECT_EQ(early.value(), Pattern(100000, 1));
  }
  EXPECT_TRUE(
      Eventually([&] { return s.value()->Exists("doomed").code() == StatusCode::kNotFound; }));
  EXPECT_EQ(s.value()->Get("doomed").status().code(), StatusCode::kNotFound);
  auto safe = s.value()->Get("safe");
  ASSERT_TRUE(safe.ok()) << safe.status().ToString();
  EXPECT_EQ(safe.value(), Pattern(100000, 2));
  // New puts go to the surviving node.
  EXPECT_TRUE(s.value()->Put("after", Pattern(1000, 3)).ok());
}

TEST(Store, MasterRestartNodesMountAgainAndClientsRecover) {
  // Short put timeouts: the restarted master fences the nodes' free space
  // that long, for the old master's grants.
  const std::vector<std::string> flags = {"--node-ttl-ms", "2000",       "--put-timeout-ms",
                                          "1000",          "--lease-ms", "1000"};
  auto c = StartCluster(2, "16MiB", flags);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string addr = c.value().master.address;
  auto s = Client(addr);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s.value()->Put("before", Pattern(1000, 1)).ok());
  // Once its node has listed it (recovery_test.cc has the rest).
  ASSERT_TRUE(Eventually(
      [&] { return Metric(c.value().master.http_port, "ferry_store_catalog_pending") == 0; }));
  ASSERT_TRUE(c.value().master.proc->Signal(SIGKILL).ok());
  (void)c.value().master.proc->Wait(Millis(5000));
  EXPECT_FALSE(s.value()->Exists("before").ok());  // no master: a clear error, no hang
  const std::string port = addr.substr(addr.rfind(':') + 1);
  std::vector<std::string> again_flags = flags;
  again_flags.insert(again_flags.end(), {"--port", port, "--tick-ms", "20"});
  auto again = cli::SpawnMaster(FerryBin(), again_flags);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  c.value().master = std::move(again).value();
  // The nodes mount again, with what they hold, and the client's puts and
  // gets work once they have.
  EXPECT_TRUE(Eventually([&] { return s.value()->Put("after", Pattern(5000, 2)).ok(); }));
  auto got = s.value()->Get("after");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), Pattern(5000, 2));
  PutOptions two;
  two.replicas = 2;  // both nodes are back
  EXPECT_TRUE(Eventually([&] { return s.value()->Put("both", Pattern(10, 3), two).ok(); }));
  auto before = s.value()->Get("before");
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ(before.value(), Pattern(1000, 1));
}

// Batches of one shape, each value its own pattern; true when every put succeeded.
struct ShapedPuts {
  Store& store;
  int batch = 0;
  static constexpr size_t kSize = 64 << 10, kPerBatch = 8;
  std::string Key(int b, size_t i) const { return fmt::format("b{}_{}", b, i); }
  uint64_t Seed(int b, size_t i) const { return static_cast<uint64_t>(b) * kPerBatch + i; }
  bool Put() {
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> values;
    for (size_t i = 0; i < kPerBatch; ++i) {
      keys.push_back(Key(batch, i));
      values.push_back(Pattern(kSize, Seed(batch, i)));
    }
    std::vector<std::span<const uint8_t>> spans(values.begin(), values.end());
    bool ok = true;
    for (const Status& st : store.BatchPut(keys, spans)) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      ok = ok && st.ok();
    }
    ++batch;
    return ok;
  }
  void ExpectBatch(int b) {
    for (size_t i = 0; i < kPerBatch; ++i) {
      auto got = store.Get(Key(b, i));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got.value(), Pattern(kSize, Seed(b, i)));
    }
  }
};

TEST(Store, PutsOfAShapeSeenBeforeUseReservationsEvenWhenTheirNodeIsGone) {
  auto c = StartCluster(2, "16MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const int http = c.value().master.http_port;
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  ShapedPuts puts{*s.value()};
  // From the second batch on, puts commit space reserved for them ahead.
  ASSERT_TRUE(Eventually([&] {
    return puts.Put() &&
           Metric(http, "ferry_store_reservations_committed_total") >= int64_t{puts.kPerBatch};
  }));
  for (int b = 0; b < puts.batch; ++b) puts.ExpectBatch(b);
  // The pool holds a batch's worth again, about half on each node; then one
  // node leaves, and the master forgets the reservations there.
  ASSERT_TRUE(Eventually([&] {
    return Metric(http, "ferry_store_reservations_total") -
               Metric(http, "ferry_store_reservations_committed_total") >=
           int64_t{puts.kPerBatch};
  }));
  ASSERT_TRUE(c.value().nodes[1].proc->Signal(SIGTERM).ok());
  (void)c.value().nodes[1].proc->Wait(Millis(10000));
  ASSERT_TRUE(Eventually([&] {
    auto st = s.value()->Stats();
    return st.ok() && st.value().nodes == 1;
  }));
  // Every put succeeds still: one whose reservation is void goes again.
  ASSERT_TRUE(puts.Put());
  puts.ExpectBatch(puts.batch - 1);
}

TEST(Store, ASizeSeenOnceReservesNothingUntilItComesAgain) {
  auto c = StartCluster(1, "16MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const int http = c.value().master.http_port;
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  ShapedPuts puts{*s.value()};
  ASSERT_TRUE(puts.Put());
  std::this_thread::sleep_for(Millis(600));  // three rounds of the pool's thread
  EXPECT_EQ(Metric(http, "ferry_store_reservations_total"), 0);
  ASSERT_TRUE(puts.Put());
  EXPECT_TRUE(Eventually(
      [&] { return Metric(http, "ferry_store_reservations_total") >= int64_t{puts.kPerBatch}; }));
}

TEST(Store, WithoutReservationsEveryPutBeginsAtTheMaster) {
  auto c = StartCluster(1, "16MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  StoreOptions o;
  o.reserve_bytes = 0;
  auto s = Client(c.value().master.address, o);
  ASSERT_TRUE(s.ok());
  ShapedPuts puts{*s.value()};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(puts.Put());
  puts.ExpectBatch(3);
  EXPECT_EQ(Metric(c.value().master.http_port, "ferry_store_reservations_total"), 0);
  EXPECT_EQ(Metric(c.value().master.http_port, "ferry_store_puts_begun_total"), 4 * 8);
}

TEST(Store, ConcurrentClientsUnderEvictionSeeOnlyWholeValues) {
  // Short leases: each get fences its value's space for the lease, so forced
  // removes of values just read hold memory until their leases end. A put may
  // then find all free space fenced and nothing evictable: ResourceExhausted,
  // with the fenced bytes in the message, is a correct answer here.
  auto c = StartCluster(2, "8MiB", {"--lease-ms", "200", "--write-grace-ms", "50"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  constexpr int kThreads = 4, kOps = 40;
  std::vector<std::unique_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) {
    auto s = Client(c.value().master.address);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    clients.push_back(std::move(s).value());
  }
  std::atomic<int> bad{0}, stored{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Store& s = *clients[t];
      for (int i = 0; i < kOps; ++i) {
        // Keys shared between threads: each value is tagged by its seed, so a
        // reader can tell a whole value of any writer from a torn one.
        const int k = (t * 7 + i) % 24;
        const std::string key = fmt::format("c/{}", k);
        const uint64_t seed = static_cast<uint64_t>(k) * 1000 + static_cast<uint64_t>(t);
        Status st = s.Put(key, Pattern(256 << 10, seed));
        if (st.ok()) ++stored;
        const bool fenced = st.code() == StatusCode::kResourceExhausted &&
                            st.message().find("fenced") != std::string::npos;
        // Another thread's forced remove of the key, or the 50 ms write grace
        // on a loaded machine, ends a put still open: NotFound, "no open put".
        // (Seen in CI on 2026-12-03; 1 to 3 runs in 30 on the 2-core VM.)
        const bool ended = st.code() == StatusCode::kNotFound &&
                           st.message().find("no open put") != std::string::npos;
        if (!st.ok() && st.code() != StatusCode::kAlreadyExists && st.code() != StatusCode::kBusy &&
            !fenced && !ended) {
          ++bad;
          ADD_FAILURE() << "put " << key << ": " << st.ToString();
        }
        auto got = s.Get(key);
        if (got.ok()) {
          bool whole = false;
          for (int w = 0; w < kThreads && !whole; ++w) {
            whole = got.value() == Pattern(256 << 10, static_cast<uint64_t>(k) * 1000 + w);
          }
          if (!whole) {
            ++bad;
            ADD_FAILURE() << "get " << key << " returned a torn or foreign value";
          }
        } else if (got.status().code() != StatusCode::kNotFound &&
                   got.status().code() != StatusCode::kTimeout) {  // outlived a 200 ms lease
          ++bad;
          ADD_FAILURE() << "get " << key << ": " << got.status().ToString();
        }
        if (i % 3 == 0) {
          Status r = s.Remove(key, /*force=*/true);
          if (!r.ok() && r.code() != StatusCode::kNotFound) {
            ++bad;
            ADD_FAILURE() << "remove " << key << ": " << r.ToString();
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(stored.load(), kThreads * kOps / 4);
}

TEST(Store, AbandonedPutIsReclaimedByTheMaster) {
  auto c = StartCluster(1, "4MiB", {"--put-timeout-ms", "300", "--write-grace-ms", "0"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  // A client that begins a put of the whole node and disappears.
  auto mc = store::MasterClient::Connect(c.value().master.address, Millis(5000));
  ASSERT_TRUE(mc.ok());
  auto begun =
      mc.value()->PutBegin({{"abandoned", 4 << 20, 1, "", StorePin::kNone, Millis(0)}}, "", false);
  ASSERT_TRUE(begun.ok() && begun.value()[0].ok());
  mc.value().reset();
  EXPECT_EQ(s.value()->Exists("abandoned").code(), StatusCode::kNotFound);
  // Once reclaimed, its key and its space are free again.
  EXPECT_TRUE(Eventually([&] { return s.value()->Put("abandoned", Pattern(4 << 20, 1)).ok(); }));
  EXPECT_TRUE(Eventually(
      [&] { return Metric(c.value().master.http_port, "ferry_store_puts_reclaimed_total") == 1; }));
}

TEST(Store, MetricsAndHealthOverHttp) {
  auto c = StartCluster(2, "16MiB");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_GT(c.value().master.http_port, 0);
  auto s = Client(c.value().master.address);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s.value()->Put("m", Pattern(100, 1)).ok());
  httplib::Client http("127.0.0.1", c.value().master.http_port);
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  auto health = http.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto st = s.value()->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st.value().term, 0u);  // ferry master's, from the clock
  EXPECT_EQ(health->body, fmt::format("ok\nterm {}\nrecovered_objects 0\n", st.value().term));
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find(fmt::format("ferry_store_term {}\n", st.value().term)),
            std::string::npos);
  EXPECT_NE(metrics->body.find("ferry_store_recovered_objects 0\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("ferry_store_nodes 2\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("ferry_store_puts_committed_total 1\n"), std::string::npos);
}

TEST(Store, SingleProcessByDefaultHoldsItsOwnReplica) {
  StoreOptions o;
  o.local_memory = 32 << 20;
  auto s = Store::Create(o);  // no master address: master and node in this process
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto v = Pattern(3 << 20, 5);
  ASSERT_TRUE(s.value()->Put("local", v).ok());
  auto loc = s.value()->Locate("local");
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc.value().replicas[0].extents[0].segment, s.value()->segment());
  auto got = s.value()->Get("local");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value(), v);
  // A second process-local store joins the first one's master: remote reads.
  StoreOptions o2;
  o2.master = s.value()->master_address();
  o2.local_memory = 8 << 20;
  auto s2 = Store::Create(o2);
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  auto remote = s2.value()->Get("local");
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EXPECT_EQ(remote.value(), v);
}

// Keys are bytes, not text (found by tests/fuzz's fuzz_attach): one that is
// not UTF-8 went to the master in a proto3 string, which refused to parse,
// and the put failed with an empty Internal.
TEST(Store, KeysNeedNotBeText) {
  StoreOptions o;
  o.local_memory = 4 << 20;
  auto s = Store::Create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::string key("\xff\xfe\0k", 4);
  const auto v = Pattern(1000, 3);
  ASSERT_TRUE(s.value()->Put(key, v).ok());
  EXPECT_TRUE(s.value()->Exists(key).ok());
  EXPECT_TRUE(s.value()->Pin(key, StorePin::kSoft, Millis(1000)).ok());
  auto got = s.value()->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), v);
  EXPECT_TRUE(s.value()->Remove(key, /*force=*/true).ok());
  EXPECT_EQ(s.value()->Exists(key).code(), StatusCode::kNotFound);
}

TEST(Store, TwoStoresCreatedAndDestroyedInALoop) {
  for (int i = 0; i < 3; ++i) {
    StoreOptions o;
    o.local_memory = 4 << 20;
    auto a = Store::Create(o);
    auto b = Store::Create(o);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(a.value()->Put("k", Pattern(1000, i)).ok());
    ASSERT_TRUE(b.value()->Put("k", Pattern(1000, i + 1)).ok());  // separate stores
    EXPECT_EQ(a.value()->Get("k").value(), Pattern(1000, i));
    EXPECT_EQ(b.value()->Get("k").value(), Pattern(1000, i + 1));
  }
}

}  // namespace
}  // namespace ferry::test
