// The peer table's watch, without timings: which period it asks for, and
// that a peer it can follow wakes it at once. (It replaces a test that
// counted the watch thread's context switches over wall-clock windows, and
// passed about one time in ten without the wake.)
#include "transfer/peers.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "common/host.h"
#include "common/ticker.h"
#include "transfer/memory_registry.h"
#include "transfer/peer_memfd.h"
#include "transfer/shm/memfd_server.h"

namespace ferry {
namespace {

constexpr char kSelf[] = "127.0.0.1:1";

// A same-host peer's descriptor whose generation page is a memfd of this
// process, served as an engine serves it (shm/memfd_server.h), so the table
// can map it and follow the peer.
class FollowablePeer {
 public:
  FollowablePeer() {
    fd_ = memfd_create("test-generation", MFD_CLOEXEC);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(kGenerationPageBytes)), 0);
    registry_.set_control_memfd(fd_);
    auto server = MemfdServer::Start(registry_, Millis(2000));
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (server.ok()) server_ = std::move(server).value();
  }
  ~FollowablePeer() {
    server_.reset();
    close(fd_);
  }
  SegmentDescriptor Descriptor() const {
    SegmentDescriptor d;
    d.epoch = 5;
    d.host_id = HostIdentity();
    d.pid = static_cast<uint32_t>(getpid());
    d.control_memfd = fd_;
    d.transports = {kMemfdServerTransport};
    d.transport_blobs = {server_ ? server_->blob() : std::string()};
    return d;
  }

 private:
  int fd_ = -1;
  MemoryRegistry registry_;
  std::unique_ptr<MemfdServer> server_;
};

TEST(PeerTable, TheWatchIdlesUntilThereIsAPeerToFollowAndIsWokenForOne) {
  std::atomic<int> woken{0}, timed{0};
  // An hour's period: any run within the test was asked for by a Wake.
  Ticker watch("test-watch", std::chrono::hours(1),
               [&](bool w) { (w ? woken : timed).fetch_add(1); });
  watch.Start();
  PeerTable peers({kSelf, Millis(100), [] { return SegmentDescriptor{}; }}, &watch);
  EXPECT_EQ(peers.WatchRound(false), PeerTable::kWatchIdle) << "no peer at all";

  // Our own segment and a peer on another host are never followed.
  SegmentDescriptor self;
  self.epoch = 1;
  EXPECT_FALSE(peers.Add(kSelf, {"127.0.0.1", 1}, self)->Watched());
  SegmentDescriptor remote;
  remote.epoch = 2;
  remote.host_id = "another host";
  EXPECT_FALSE(peers.Add("127.0.0.1:3", {"127.0.0.1", 3}, remote)->Watched());
  EXPECT_EQ(peers.WatchRound(false), PeerTable::kWatchIdle);
  EXPECT_EQ(watch.runs(), 0u) << "nothing to follow, so nothing woke the watch";

  FollowablePeer peer;
  auto seg = peers.Add("127.0.0.1:2", {"127.0.0.1", 2}, peer.Descriptor());
  ASSERT_TRUE(seg->Watched());
  for (int i = 0; i < 2000 && watch.runs() == 0; ++i) std::this_thread::sleep_for(Millis(5));
  EXPECT_EQ(woken.load(), 1) << "adding a peer to follow must wake the idle watch";
  EXPECT_EQ(timed.load(), 0);
  EXPECT_EQ(peers.WatchRound(false), PeerTable::kWatchPeriod);

  ASSERT_TRUE(peers.Close(seg->id()).ok());
  EXPECT_EQ(peers.Close(seg->id()).code(), StatusCode::kNotFound);
  EXPECT_EQ(peers.WatchRound(false), PeerTable::kWatchIdle) << "its peer closed";
}

// A peer whose generation moved on is outdated; the watch refetches it, and
// one it cannot refetch is marked stale for the next submit.
TEST(PeerTable, AnOutdatedPeerThatCannotBeRefetchedIsMarkedStale) {
  PeerTable peers({kSelf, Millis(100), [] { return SegmentDescriptor{}; }}, nullptr);
  FollowablePeer peer;
  // Nobody listens on port 9, so the refetch fails.
  auto other = peers.Add("127.0.0.1:9", {"127.0.0.1", 9}, peer.Descriptor());
  ASSERT_TRUE(other->Watched());
  EXPECT_FALSE(other->Outdated());
  void* page = mmap(nullptr, kGenerationPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                    peer.Descriptor().control_memfd, 0);
  ASSERT_NE(page, MAP_FAILED);
  __atomic_add_fetch(static_cast<uint64_t*>(page), 1, __ATOMIC_RELEASE);
  EXPECT_TRUE(other->Outdated());
  EXPECT_EQ(peers.WatchRound(true), PeerTable::kWatchPeriod);
  EXPECT_TRUE(other->TakeStale()) << "the failed refetch is left to the next submit";
  munmap(page, kGenerationPageBytes);
}

}  // namespace
}  // namespace ferry
