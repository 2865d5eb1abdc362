// Engine metadata on etcd (EngineOptions::metadata "etcd://..."): engines in
// separate processes find each other through etcd and transfer, a killed
// engine's entry goes within its TTL, descriptor changes reach peers through
// the watch, and bad input fails Engine::Create clearly.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "coord/etcd_client.h"
#include "ferry/engine.h"
#include "integration/etcd_server.h"
#include "integration/peer.h"

namespace ferry {
namespace {

using std::chrono::seconds;

Result<std::unique_ptr<Engine>> EtcdEngine(const std::string& url) {
  EngineOptions o;
  o.metadata = url;
  o.metadata_ttl = seconds(2);
  o.connect_timeout = Millis(2000);
  return Engine::Create(o);
}

std::shared_ptr<coord::EtcdClient> Client(const test::EtcdServer& etcd) {
  return coord::EtcdClient::Create({{etcd.endpoint()}, Millis(2000)}).value();
}

std::string KeyOf(const std::string& cluster, const std::string& name) {
  return "/ferry/" + cluster + "/engines/" + name;
}

// `probe` returns true within `within`.
template <typename F>
bool Eventually(F probe, Millis within) {
  const Deadline d = Deadline::After(within);
  while (!probe()) {
    if (d.Expired()) return false;
    std::this_thread::sleep_for(Millis(50));
  }
  return true;
}

// A `ferry serve` in its own process, publishing in etcd at `url`.
Result<test::Peer> EtcdPeer(const std::string& url) {
  return test::StartPeer(1 << 20, 0, 0, 0, 0, {"--metadata", url});
}

TEST(EtcdMetadata, CreateRefusesMalformedStringsAndUnreachableEtcd) {
  EngineOptions o;
  o.connect_timeout = Millis(500);
  o.metadata = "etcd://127.0.0.1/c";
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  EXPECT_NE(e.status().message().find("host:port"), std::string::npos) << e.status().ToString();
  o.metadata = "etcd://127.0.0.1:2379";
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.metadata = "zookeeper://127.0.0.1:2181/c";
  e = Engine::Create(o);
  EXPECT_EQ(e.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(e.status().message().find("etcd://"), std::string::npos) << e.status().ToString();

  uint16_t port = 0;
  close(test::ListenOnLoopback(&port));  // nobody listens there now
  const std::string dead = "127.0.0.1:" + std::to_string(port);
  o.metadata = "etcd://" + dead + "/c";
  e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnavailable) << e.status().ToString();
  EXPECT_NE(e.status().message().find(dead), std::string::npos) << e.status().ToString();
}

TEST(EtcdMetadata, ABadTtlFromTheEnvironmentIsRefused) {
  FERRY_SKIP_WITHOUT_ETCD();
  auto etcd = test::EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  for (const char* bad : {"0", "ten"}) {
    setenv("FERRY_METADATA_TTL_S", bad, 1);
    auto e = EtcdEngine(etcd.value()->Url("c"));
    unsetenv("FERRY_METADATA_TTL_S");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
    EXPECT_NE(e.status().message().find("FERRY_METADATA_TTL_S"), std::string::npos);
  }
}

TEST(EtcdMetadata, EnginesInTwoProcessesFindEachOtherThroughEtcdAndTransfer) {
  FERRY_SKIP_WITHOUT_ETCD();
  auto etcd = test::EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string url = etcd.value()->Url("two");
  auto peer = EtcdPeer(url);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto client = Client(*etcd.value());
  auto entry = client->Get(KeyOf("two", peer.value().segment));
  ASSERT_TRUE(entry.ok() && entry.value().has_value());
  EXPECT_NE(entry.value()->lease, 0);  // bound to the peer's lease

  auto e = EtcdEngine(url);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // The descriptor comes from etcd: a frozen listener does not matter.
  ASSERT_TRUE(peer.value().proc->Signal(SIGSTOP).ok());
  auto seg = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(peer.value().proc->Signal(SIGCONT).ok());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto info = e.value()->GetSegmentInfo(seg.value());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info.value().epoch, peer.value().epoch);

  std::vector<uint8_t> out(64 << 10), back(out.size());
  test::FillRandom(out.data(), out.size(), 17);
  Request w{Op::kWrite, out.data(), seg.value(), peer.value().alloc_addr, out.size()};
  ASSERT_TRUE(e.value()->Transfer(w).ok());
  Request r{Op::kRead, back.data(), seg.value(), peer.value().alloc_addr, back.size()};
  ASSERT_TRUE(e.value()->Transfer(r).ok());
  EXPECT_EQ(out, back);

  // A clean shutdown withdraws the entry at once.
  ASSERT_TRUE(peer.value().proc->Signal(SIGTERM).ok());
  ASSERT_TRUE(peer.value().proc->Wait(seconds(20)).ok());
  EXPECT_FALSE(client->Get(KeyOf("two", peer.value().segment)).value().has_value());
  EXPECT_EQ(e.value()->OpenSegment(peer.value().segment).status().code(), StatusCode::kNotFound);
}

TEST(EtcdMetadata, AKilledEnginesEntryGoesWithinItsTtlAndPeersSeeNotFound) {
  FERRY_SKIP_WITHOUT_ETCD();
  auto etcd = test::EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string url = etcd.value()->Url("kill");
  setenv("FERRY_METADATA_TTL_S", "2", 1);  // the child inherits it
  auto peer = EtcdPeer(url);
  unsetenv("FERRY_METADATA_TTL_S");
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto e = EtcdEngine(url);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto seg = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto client = Client(*etcd.value());
  const std::string key = KeyOf("kill", peer.value().segment);
  auto entry = client->Get(key);
  ASSERT_TRUE(entry.ok() && entry.value().has_value());
  auto ttl = client->LeaseTimeToLive(entry.value()->lease);
  ASSERT_TRUE(ttl.ok());
  EXPECT_LE(ttl.value(), 2);

  ASSERT_TRUE(peer.value().proc->Signal(SIGKILL).ok());
  ASSERT_TRUE(peer.value().proc->Wait(seconds(10)).ok());
  // Nobody deletes it: the lease, no longer renewed, takes it (TTL 2 s,
  // plus etcd's expiry check; the bound is generous for a loaded machine).
  EXPECT_TRUE(Eventually([&] { return !client->Get(key).value().has_value(); }, Millis(8000)));
  // The watch tells the peer, which refetches and finds nothing.
  EXPECT_TRUE(Eventually(
      [&] {
        return e.value()->GetSegmentInfo(seg.value()).status().code() == StatusCode::kNotFound;
      },
      Millis(5000)));
  EXPECT_EQ(e.value()->OpenSegment(peer.value().segment).status().code(), StatusCode::kNotFound);
  std::vector<uint8_t> buf(4096);
  Request r{Op::kRead, buf.data(), seg.value(), peer.value().alloc_addr, buf.size()};
  EXPECT_EQ(e.value()->Transfer(r).code(), StatusCode::kNotFound);
}

TEST(EtcdMetadata, ARegistrationChangeReachesPeersThroughTheWatch) {
  FERRY_SKIP_WITHOUT_ETCD();
  auto etcd = test::EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string url = etcd.value()->Url("watch");
  auto a = EtcdEngine(url);
  auto b = EtcdEngine(url);
  ASSERT_TRUE(a.ok() && b.ok());
  auto seg = b.value()->OpenSegment(a.value()->name());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_TRUE(b.value()->GetSegmentInfo(seg.value()).value().buffers.empty());

  // GetSegmentInfo refetches only what was invalidated: the new buffer can
  // show only through the watch.
  std::vector<uint8_t> mem(1 << 20);
  ASSERT_TRUE(a.value()->RegisterMemory(mem.data(), mem.size()).ok());
  EXPECT_TRUE(Eventually(
      [&] {
        auto info = b.value()->GetSegmentInfo(seg.value());
        return info.ok() && info.value().buffers.size() == 1 &&
               info.value().buffers[0].addr == reinterpret_cast<uint64_t>(mem.data());
      },
      Millis(5000)));

  a.value().reset();  // withdraws its entry
  EXPECT_TRUE(Eventually(
      [&] {
        return b.value()->GetSegmentInfo(seg.value()).status().code() == StatusCode::kNotFound;
      },
      Millis(5000)));
}

TEST(EtcdMetadata, EnginesCarryOnAcrossAnEtcdRestart) {
  FERRY_SKIP_WITHOUT_ETCD();
  auto etcd = test::EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string url = etcd.value()->Url("restart");
  auto a = EtcdEngine(url);
  auto b = EtcdEngine(url);
  ASSERT_TRUE(a.ok() && b.ok());
  auto seg = b.value()->OpenSegment(a.value()->name());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();

  ASSERT_TRUE(etcd.value()->Restart().ok());
  // Published once etcd answers (now or by the background retry), and seen
  // by the peer's watch, which resumes after the restart.
  std::vector<uint8_t> mem(1 << 20);
  ASSERT_TRUE(a.value()->RegisterMemory(mem.data(), mem.size()).ok());
  EXPECT_TRUE(Eventually(
      [&] {
        auto info = b.value()->GetSegmentInfo(seg.value());
        return info.ok() && info.value().buffers.size() == 1;
      },
      Millis(10000)));
  // And an engine started after it finds the first.
  auto c = EtcdEngine(url);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c.value()->OpenSegment(a.value()->name()).ok());
}

TEST(EtcdMetadata, AnEngineRepublishesWhenItsEntryIsDeletedBehindItsBack) {
  FERRY_SKIP_WITHOUT_ETCD();
  auto etcd = test::EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  auto a = EtcdEngine(etcd.value()->Url("heal"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto client = Client(*etcd.value());
  const std::string key = KeyOf("heal", a.value()->name());
  ASSERT_TRUE(client->Get(key).value().has_value());
  ASSERT_TRUE(client->Delete(key).ok());
  EXPECT_TRUE(Eventually([&] { return client->Get(key).value().has_value(); }, Millis(5000)));
}

}  // namespace
}  // namespace ferry
