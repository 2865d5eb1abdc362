// Master leader election and leader discovery (store/rpc/leader.h) against a
// real etcd: one leader of two candidates, hand-over on resignation and on a
// dead leader's TTL, deposition when the lease goes, terms that only grow,
// a leader that cannot read its key standing down, and bad input.
#include "store/rpc/leader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "coord/etcd_client.h"
#include "integration/etcd_server.h"
#include "store/rpc/proto_util.h"

namespace ferry::store {
namespace {

using std::chrono::seconds;

// What one candidate was told, for a test to wait on.
struct Events {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> terms;  // one per election
  int deposed = 0;

  LeaderElection::ElectedFn Elected() {
    return [this](uint64_t term, Millis) {
      std::lock_guard lk(mu);
      terms.push_back(term);
      cv.notify_all();
    };
  }
  LeaderElection::DeposedFn Deposed() {
    return [this](const Status&) {
      std::lock_guard lk(mu);
      ++deposed;
      cv.notify_all();
    };
  }
  bool WaitElections(size_t n, seconds timeout) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, [&] { return terms.size() >= n; });
  }
  size_t elections() {
    std::lock_guard lk(mu);
    return terms.size();
  }
  uint64_t term(size_t i) {
    std::lock_guard lk(mu);
    return terms.at(i);
  }
  bool WaitDeposed(int n, seconds timeout) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, [&] { return deposed >= n; });
  }
};

class LeaderLive : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_ETCD();
    auto s = test::EtcdServer::Start();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    etcd_ = std::move(s).value();
    auto c = coord::EtcdClient::Create({{etcd_->endpoint()}, Millis(2000)});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = c.value();
  }

  std::unique_ptr<LeaderElection> Candidate(const std::string& address, Events* ev,
                                            int64_t ttl = 2) {
    LeaderElection::Options o;
    o.address = address;
    o.ttl_seconds = ttl;
    o.poll = Millis(50);
    auto e = LeaderElection::Start(client_, "c1", o, ev->Elected(), ev->Deposed());
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  std::unique_ptr<test::EtcdServer> etcd_;
  std::shared_ptr<coord::EtcdClient> client_;
};

// Nodes on the roster are listed while their entries live; an entry goes
// when its node stops, and bad names are refused.
TEST_F(LeaderLive, TheRosterListsLiveNodesOnly) {
  auto empty = ReadRoster(*client_, "c1");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty.value().empty());
  auto a = RosterEntry::Start(client_, "c1", "10.0.0.1:7000", 1);
  auto b = RosterEntry::Start(client_, "c1", "10.0.0.2:7000", 1);
  auto other = RosterEntry::Start(client_, "c2", "10.0.0.3:7000", 1);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok()) << a.status().ToString();
  auto two = ReadRoster(*client_, "c1");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two.value(), (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7000"}));
  // Past its TTL, kept alive: still there.
  std::this_thread::sleep_for(Millis(1500));
  EXPECT_EQ(ReadRoster(*client_, "c1").value().size(), 2u);
  a.value().reset();  // revoked at once, not after its TTL
  EXPECT_EQ(ReadRoster(*client_, "c1").value(), std::vector<std::string>{"10.0.0.2:7000"});
  EXPECT_EQ(RosterEntry::Start(client_, "c1", "", 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RosterEntry::Start(client_, "c1", "n", 0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(LeaderLive, OneOfTwoCandidatesLeadsAndTheResolverFindsIt) {
  Events ea, eb;
  auto a = Candidate("127.0.0.1:1001", &ea);
  auto b = Candidate("127.0.0.1:1002", &eb);
  auto r = LeaderResolver::Start(client_, "c1", Millis(50));
  ASSERT_TRUE(r.ok());
  auto leader = r.value()->Leader(Millis(10000));
  ASSERT_TRUE(leader.ok()) << leader.status().ToString();
  std::this_thread::sleep_for(Millis(300));  // both had rounds to try
  EXPECT_NE(a->leading(), b->leading());
  LeaderElection* lead = a->leading() ? a.get() : b.get();
  EXPECT_EQ(leader.value().address, a->leading() ? "127.0.0.1:1001" : "127.0.0.1:1002");
  EXPECT_EQ(leader.value().term, lead->term());
  EXPECT_GT(lead->term(), 0u);
  EXPECT_EQ(ea.elections() + eb.elections(), 1u);
}

TEST_F(LeaderLive, AResigningLeaderHandsOverAtOnceWithAHigherTerm) {
  Events ea, eb;
  auto a = Candidate("127.0.0.1:1001", &ea, 30);
  ASSERT_TRUE(ea.WaitElections(1, seconds(10)));
  auto b = Candidate("127.0.0.1:1002", &eb, 30);
  std::this_thread::sleep_for(Millis(200));
  EXPECT_FALSE(b->leading());
  const uint64_t first = a->term();
  a.reset();  // resigns: revokes its 30 s lease
  ASSERT_TRUE(eb.WaitElections(1, seconds(5))) << "the standby waited out the TTL";
  EXPECT_GT(b->term(), first);
}

TEST_F(LeaderLive, ADeadLeadersKeyLastsItsTtlThenAStandbyTakesOver) {
  // A leader that died: its key is there, bound to a lease nobody renews.
  auto lease = client_->LeaseGrant(2);
  ASSERT_TRUE(lease.ok());
  auto put = client_->Put(LeaderKey("c1"), "127.0.0.1:999", lease.value().id);
  ASSERT_TRUE(put.ok());
  auto r = LeaderResolver::Start(client_, "c1", Millis(50));
  ASSERT_TRUE(r.ok());
  auto dead = r.value()->Leader(Millis(5000));
  ASSERT_TRUE(dead.ok());
  EXPECT_EQ(dead.value().address, "127.0.0.1:999");

  Events ev;
  auto c = Candidate("127.0.0.1:1003", &ev);
  std::this_thread::sleep_for(Millis(300));
  EXPECT_FALSE(c->leading()) << "took the key of a leader whose lease still runs";
  ASSERT_TRUE(ev.WaitElections(1, seconds(15)));
  EXPECT_GT(c->term(), dead.value().term);
  // The resolver follows the change.
  Deadline d = Deadline::After(Millis(5000));
  Result<LeaderInfo> now = r.value()->Leader(Millis(100));
  while (!d.Expired() && (!now.ok() || now.value().address != "127.0.0.1:1003")) {
    std::this_thread::sleep_for(Millis(50));
    now = r.value()->Leader(Millis(100));
  }
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now.value().address, "127.0.0.1:1003");
  EXPECT_EQ(now.value().term, c->term());
}

// What a process paused past its TTL finds when it resumes: its lease gone.
TEST_F(LeaderLive, ALeaderWhoseLeaseIsGoneIsDeposedAndCampaignsAgain) {
  Events ev;
  auto a = Candidate("127.0.0.1:1001", &ev);
  ASSERT_TRUE(ev.WaitElections(1, seconds(10)));
  const uint64_t first = a->term();
  EXPECT_TRUE(a->Confirmed().ok()) << a->Confirmed().ToString();
  auto kv = client_->Get(LeaderKey("c1"));
  ASSERT_TRUE(kv.ok() && kv.value());
  ASSERT_TRUE(client_->LeaseRevoke(kv.value()->lease).ok());
  ASSERT_TRUE(ev.WaitDeposed(1, seconds(10)));
  EXPECT_EQ(a->Confirmed().code(), StatusCode::kUnavailable);
  // Alone, it wins again, in a new term.
  ASSERT_TRUE(ev.WaitElections(2, seconds(10)));
  EXPECT_GT(ev.term(1), first);
}

// A leader whose reads of its key fail while its lease is still renewed
// (etcd answering its lease renewals and nothing else) cannot confirm, so
// it serves nothing; it stands down past its serving time, so that a
// standby that reaches etcd takes over instead of the seat staying held by
// nobody serving.
TEST_F(LeaderLive, ALeaderThatCannotReadItsKeyStandsDownForAStandby) {
  auto c = coord::EtcdClient::Create({{etcd_->endpoint()}, Millis(2000)});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto faulty = c.value();
  std::atomic<bool> fail_reads{false};
  faulty->InjectFaults([&](std::string_view rpc) {
    if ((rpc == "Range" || rpc == "Txn") && fail_reads.load()) {
      return Status::Unavailable("injected: " + std::string(rpc) + " fails");
    }
    return Status::Ok();
  });
  Events ea, eb;
  LeaderElection::Options o;
  o.address = "127.0.0.1:1001";
  o.ttl_seconds = 2;
  o.poll = Millis(50);
  auto a = LeaderElection::Start(faulty, "c1", o, ea.Elected(), ea.Deposed());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(ea.WaitElections(1, seconds(10)));
  const uint64_t first = a.value()->term();
  auto b = Candidate("127.0.0.1:1002", &eb);
  std::this_thread::sleep_for(Millis(300));
  ASSERT_FALSE(b->leading());
  fail_reads = true;
  ASSERT_TRUE(ea.WaitDeposed(1, seconds(10))) << "a leader that cannot confirm kept the seat";
  EXPECT_EQ(a.value()->Confirmed().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(eb.WaitElections(1, seconds(10)));
  EXPECT_GT(b->term(), first);
  // Its reads back, the old leader finds the seat taken and stays a standby.
  fail_reads = false;
  std::this_thread::sleep_for(Millis(500));
  EXPECT_FALSE(a.value()->leading());
  EXPECT_TRUE(b->leading());
}

TEST_F(LeaderLive, TheResolverSaysWhenNobodyLeads) {
  auto r = LeaderResolver::Start(client_, "nobody", Millis(50));
  ASSERT_TRUE(r.ok());
  auto leader = r.value()->Leader(Millis(300));
  ASSERT_FALSE(leader.ok());
  EXPECT_EQ(leader.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(leader.status().message().find("no master leads"), std::string::npos)
      << leader.status().ToString();
}

TEST(LeaderElection, RefusesBadOptions) {
  auto c = coord::EtcdClient::Create({{"127.0.0.1:1"}, Millis(100)});
  ASSERT_TRUE(c.ok());
  LeaderElection::Options o;
  EXPECT_EQ(LeaderElection::Start(c.value(), "c1", o, nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  o.address = "127.0.0.1:5";
  o.ttl_seconds = 0;
  EXPECT_EQ(LeaderElection::Start(c.value(), "c1", o, nullptr, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

// A call the master dropped (CANCELLED: the store never cancels its own) is
// Unavailable, as an unreachable master is, so the caller looks for the
// leader again instead of failing with Internal.
TEST(MasterCodes, ACallTheMasterDroppedIsUnavailable) {
  EXPECT_EQ(CodeFromGrpc(grpc::StatusCode::CANCELLED), StatusCode::kUnavailable);
  EXPECT_EQ(CodeFromGrpc(grpc::StatusCode::UNAVAILABLE), StatusCode::kUnavailable);
  EXPECT_EQ(CodeFromGrpc(grpc::StatusCode::DATA_LOSS), StatusCode::kInternal);
}

}  // namespace

}  // namespace ferry::store
