// Same-host peers that forbid tracing (issue 18, point 3): a non-dumpable
// peer's memfds come over its memfd socket, heap memory of such a peer goes
// over tcp, a peer of another uid is refused shm, and the memfd socket
// closes only the connection of a bad request. And same-host set-up costs
// (issue 16, point 5): a peer's buffers are mapped before any request.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "common/fd_passing.h"
#include "common/subprocess.h"
#include "ferry/engine.h"
#include "integration/peer.h"
#include "transfer/metadata.h"
#include "transfer/peer_memfd.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- same-host peers that forbid tracing (issue 18, point 3) ----

// Drops CAP_SYS_PTRACE from this thread's effective set, so that root traces
// no more than any user does; threads started meanwhile (an engine's)
// inherit that. Restored when it goes. Nothing to drop for other users.
class WithoutTracePrivilege {
 public:
  WithoutTracePrivilege() {
    if (syscall(SYS_capget, &head_, data_) != 0) return;
    saved_ = data_[0].effective;
    data_[0].effective &= ~(1u << CAP_SYS_PTRACE);
    dropped_ = syscall(SYS_capset, &head_, data_) == 0;
  }
  ~WithoutTracePrivilege() {
    if (!dropped_) return;
    data_[0].effective = saved_;
    EXPECT_EQ(syscall(SYS_capset, &head_, data_), 0);
  }

 private:
  __user_cap_header_struct head_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data_[2] = {};
  uint32_t saved_ = 0;
  bool dropped_ = false;
};

// errno of a one-byte process_vm read at address 0 of `pid`: EFAULT once
// the kernel let us in, EPERM when it did not.
int ProcessVmError(pid_t pid) {
  char byte;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) < 0 ? errno : 0;
}

// Writes a pattern into the peer's [addr, addr+n) and reads it back; returns
// the transports that served the two requests.
std::pair<std::string, std::string> RoundTrip(Engine& e, SegmentId s, uint64_t addr, size_t n) {
  std::vector<char> out(n), in(n);
  test::FillRandom(out.data(), n, addr);
  std::string served[2];
  for (int i = 0; i < 2; ++i) {
    Request r{i == 0 ? Op::kWrite : Op::kRead, i == 0 ? out.data() : in.data(), s, addr, n};
    auto b = e.Submit(std::span<const Request>(&r, 1));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return {};
    Status st = b.value()->Wait(seconds(10));
    EXPECT_TRUE(st.ok()) << st.ToString();
    served[i] = b.value()->Result(0).transport;
  }
  EXPECT_TRUE(out == in) << "the bytes read back differ from those written";
  return {served[0], served[1]};
}

// The finding: shm reached a peer by opening /proc/<pid>/fd, and every
// engine called PR_SET_PTRACER_ANY so that it could. A hardened peer (not
// dumpable) closes /proc/<pid>/fd and process_vm to the processes of its own
// uid; it is still served over shm, its memfds passed over a socket.
TEST(SameHostHardening, ANonDumpablePeerIsServedOverShm) {
  auto peer = test::StartPeer(1 << 20, 0, 0, 0, 0, {"--non-dumpable"});
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  WithoutTracePrivilege untraced;
  ASSERT_EQ(ProcessVmError(peer.value().proc->pid()), EPERM) << "the peer can be traced";
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok());
  auto served = RoundTrip(*e.value(), s.value(), peer.value().alloc_addr + 7, 256 << 10);
  EXPECT_EQ(served.first, "shm");
  EXPECT_EQ(served.second, "shm");
}

// Memory that is not a memfd is reachable only through process_vm, which the
// hardened peer refuses: that segment goes over tcp, whole (routing is per
// segment), and stays correct.
TEST(SameHostHardening, HeapMemoryOfANonDumpablePeerSendsItOverTcp) {
  auto peer = test::StartPeer(1 << 20, 1 << 20, 0, 0, 0, {"--non-dumpable"});
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  WithoutTracePrivilege untraced;
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok());
  for (uint64_t addr : {peer.value().heap_addr, peer.value().alloc_addr}) {
    auto served = RoundTrip(*e.value(), s.value(), addr, 64 << 10);
    EXPECT_EQ(served.first, "tcp");
    EXPECT_EQ(served.second, "tcp");
  }
}

// The shm blob of a segment's descriptor: where its memfd server listens.
MemfdServerAddress MemfdServerOf(const std::string& segment) {
  auto addr = ParseSegmentName(segment);
  EXPECT_TRUE(addr.ok());
  auto d = FetchDescriptor(addr.value(), Millis(5000));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  auto at = d.ok() ? DecodeMemfdServer(d.value().SegmentBlobOf("shm")) : std::nullopt;
  EXPECT_TRUE(at.has_value()) << "no memfd server in " << segment << "'s descriptor";
  return at.value_or(MemfdServerAddress{});
}

// A connected socket to the memfd server at `at`, or -1.
int DialMemfdServer(const MemfdServerAddress& at) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, at.name.data(), at.name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + at.name.size());
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads what the server sends until it closes `sock` (true), or `wait`
// passes (false). The bytes go to `*got`, any fds passed are closed and counted.
bool ClosedBy(int sock, Millis wait, std::string* got = nullptr, int* fds = nullptr) {
  const Deadline deadline = Deadline::After(wait);
  for (;;) {
    pollfd p{sock, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::chrono::ceil<Millis>(deadline.Remaining()).count())) <=
        0) {
      return false;
    }
    char buf[64];
    std::vector<int> passed;
    const ssize_t n = ReceiveWithFds(sock, buf, sizeof(buf), &passed);
    for (int fd : passed) close(fd);
    if (fds != nullptr) *fds += static_cast<int>(passed.size());
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) return true;
    if (got != nullptr) got->append(buf, static_cast<size_t>(n));
  }
}

// Real and effective uid `uid` for every thread of this process (glibc sets
// them all), so the kernel checks that uid (process_vm looks at the real one)
// and threads started meanwhile have it. The saved 0 lets it back.
class AsAnotherUid {
 public:
  explicit AsAnotherUid(uid_t uid) : ok_(setresuid(uid, uid, 0) == 0) {}
  ~AsAnotherUid() {
    if (!ok_) return;
    EXPECT_EQ(setresuid(0, 0, 0), 0);
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);  // changing uids made this process non-dumpable
  }
  bool ok() const { return ok_; }

 private:
  const bool ok_;
};

// Another uid may not map this process's memory: its connection is closed
// unanswered, and its engine moves the bytes over tcp, saying why in a log
// line. Needs root, to be another uid for a while.
TEST(SameHostHardening, APeerOfAnotherUidIsRefusedAndServedOverTcp) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  auto peer = test::StartPeer(1 << 20, 0);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const MemfdServerAddress at = MemfdServerOf(peer.value().segment);
  ASSERT_FALSE(at.name.empty());
  ASSERT_EQ(at.uid, 0u);
  {
    AsAnotherUid nobody(65534);
    ASSERT_TRUE(nobody.ok()) << std::strerror(errno);
    const int sock = DialMemfdServer(at);
    ASSERT_GE(sock, 0);
    uint8_t req[memfd_wire::kRequestBytes];
    EncodeMemfdRequest({3, 0, 0, 4096}, req);
    (void)!send(sock, req, sizeof(req), MSG_NOSIGNAL);
    std::string got;
    int fds = 0;
    EXPECT_TRUE(ClosedBy(sock, seconds(5), &got, &fds));
    EXPECT_EQ(got, "") << "a refused connection gets no reply";
    EXPECT_EQ(fds, 0);
    close(sock);
    auto e = Engine::Create({});
    ASSERT_TRUE(e.ok());
    auto s = e.value()->OpenSegment(peer.value().segment);
    ASSERT_TRUE(s.ok());
    auto served = RoundTrip(*e.value(), s.value(), peer.value().alloc_addr, 4096);
    EXPECT_EQ(served.first, "tcp");
    EXPECT_EQ(served.second, "tcp");
  }
}

// Under Yama (ptrace_scope 1), a process of the same uid that is not an
// ancestor may not trace one that did not invite it; an engine with shm must
// not invite anyone. The child here is such a process for its parent.
TEST(SameHostHardening, TheEngineLeavesItsProcessUntraceable) {
  int scope = -1;
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
    std::fclose(f);
  }
  if (scope < 1) GTEST_SKIP() << "no Yama restriction here: any same-uid process may trace";
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    WithoutTracePrivilege untraced;
    _exit(ProcessVmError(getppid()) == EPERM ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "a sibling-like process could read this one's memory";
}

// The memfd socket takes bad input like the listener: a malformed request, a
// short one, or one for a memfd that is not registered (as asked) closes that
// connection only; the engine keeps serving the others.
TEST(MemfdSocket, BadRequestsCloseOnlyTheirConnection) {
  EngineOptions o;
  o.connect_timeout = Millis(1000);  // also how long a request may dawdle
  auto owner = Engine::Create(o);
  ASSERT_TRUE(owner.ok());
  auto mem = owner.value()->AllocateMemory(1 << 20);
  ASSERT_TRUE(mem.ok());
  const uint64_t addr = reinterpret_cast<uint64_t>(mem.value());
  auto d = FetchDescriptor(ParseSegmentName(owner.value()->name()).value(), Millis(5000));
  ASSERT_TRUE(d.ok());
  const RegionDesc* region = d.value().Find(addr, 1);
  ASSERT_NE(region, nullptr);
  const std::string_view blob = d.value().BlobOf(*region, "shm");
  ASSERT_EQ(blob.size(), 4u);
  int32_t memfd;
  std::memcpy(&memfd, blob.data(), 4);
  const MemfdServerAddress at = MemfdServerOf(owner.value()->name());
  const MemfdRef good{memfd, addr, region->serial, 1 << 20};

  // Opened first and served last; and one that sends a short request and
  // waits, closed after the timeout meanwhile.
  const int idle = DialMemfdServer(at);
  const int short_one = DialMemfdServer(at);
  ASSERT_GE(idle, 0);
  ASSERT_GE(short_one, 0);
  ASSERT_EQ(send(short_one, "\x46\x4d\x46", 3, MSG_NOSIGNAL), 3);
  auto request = [](const MemfdRef& ref) {
    std::string r(memfd_wire::kRequestBytes, '\0');
    EncodeMemfdRequest(ref, reinterpret_cast<uint8_t*>(r.data()));
    return r;
  };
  std::string bad_version = request(good);
  bad_version[4] = 9;
  std::string bad_padding = request(good);
  bad_padding[12] = 1;
  const std::string unanswered[] = {std::string(memfd_wire::kRequestBytes, '\xab'), bad_version,
                                    bad_padding};
  for (const std::string& bytes : unanswered) {
    const int sock = DialMemfdServer(at);
    ASSERT_GE(sock, 0);
    ASSERT_EQ(send(sock, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    std::string got;
    EXPECT_TRUE(ClosedBy(sock, seconds(5), &got))
        << "not closed after " << bytes.size() << " bytes";
    EXPECT_EQ(got, "");
    close(sock);
  }
  // Well formed, but not registered as asked: refused with NotFound, then closed.
  for (const MemfdRef& ref :
       {MemfdRef{999, addr, region->serial, 1 << 20},
        MemfdRef{memfd, addr, region->serial + 1, 1 << 20},
        MemfdRef{memfd, addr + 4096, region->serial, 4096}, MemfdRef{memfd, 0, 0, 4096}}) {
    const int sock = DialMemfdServer(at);
    ASSERT_GE(sock, 0);
    const std::string bytes = request(ref);
    ASSERT_EQ(send(sock, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    std::string got;
    int fds = 0;
    EXPECT_TRUE(ClosedBy(sock, seconds(5), &got, &fds)) << "memfd " << ref.memfd;
    ASSERT_EQ(got.size(), memfd_wire::kReplyBytes) << "memfd " << ref.memfd;
    EXPECT_EQ(static_cast<StatusCode>(got[6]), StatusCode::kNotFound);
    EXPECT_EQ(fds, 0);
    close(sock);
  }

  // The first connection is served still, and so is a peer over shm.
  const std::string bytes = request(good);
  ASSERT_EQ(send(idle, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  std::string got;
  int fds = 0;
  EXPECT_FALSE(ClosedBy(idle, Millis(100), &got, &fds)) << "a good request keeps it open";
  EXPECT_EQ(got.size(), memfd_wire::kReplyBytes);
  EXPECT_EQ(got[6], 0);
  EXPECT_EQ(fds, 1);
  close(idle);
  std::string partial;
  EXPECT_TRUE(ClosedBy(short_one, seconds(5), &partial)) << "a short request is cut off";
  EXPECT_EQ(partial, "");
  close(short_one);
  auto page =
      MapPeerMemfd(d.value(), {d.value().control_memfd, 0, 0, kGenerationPageBytes}, seconds(5));
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  munmap(page.value(), kGenerationPageBytes);
  EngineOptions shm;
  shm.transport = "shm";
  auto other = Engine::Create(shm);
  ASSERT_TRUE(other.ok());
  auto s = other.value()->OpenSegment(owner.value()->name());
  ASSERT_TRUE(s.ok());
  auto served = RoundTrip(*other.value(), s.value(), addr + 100, 4096);
  EXPECT_EQ(served.first, "shm");
  EXPECT_EQ(served.second, "shm");
}

// ---- first touch paid at set-up (issue 16, point 5) ----

// The memfd inodes `pid` maps, by the address each mapping starts at.
std::map<uint64_t, uint64_t> MemfdMappings(pid_t pid) {
  std::map<uint64_t, uint64_t> out;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:ferry-segment") == std::string::npos) continue;
    unsigned long long start, end, offset, inode;
    char perms[8], dev[16];
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %15s %llu", &start, &end, perms, &offset, dev,
                    &inode) == 6) {
      out[start] = inode;
    }
  }
  return out;
}

bool MapsInode(pid_t pid, uint64_t inode) {
  for (const auto& [start, i] : MemfdMappings(pid)) {
    if (i == inode) return true;
  }
  return false;
}

// A same-host peer's engine-allocated buffers are mapped when its segment is
// opened, and one it allocates later as soon as the engine follows the
// registration, never by the first request into them: that would pay the
// mapping and its page-table fill per request (several ms per 64 MiB on a
// VM). A buffer the peer frees is unmapped here once followed.
TEST(SetUpCosts, APeersBuffersAreMappedAtOpenAndWhenItAllocatesMore) {
  auto peer = test::StartPeer(4 << 20, 0);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const pid_t owner = peer.value().proc->pid();
  const uint64_t first = MemfdMappings(owner)[peer.value().alloc_addr];
  ASSERT_NE(first, 0u) << "the peer's buffer is not a memfd mapping";
  auto e = Engine::Create({});
  ASSERT_TRUE(e.ok());
  ASSERT_FALSE(MapsInode(getpid(), first));
  auto s = e.value()->OpenSegment(peer.value().segment);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(MapsInode(getpid(), first)) << "not mapped when the segment was opened";

  ASSERT_TRUE(peer.value().proc->Signal(SIGUSR1).ok());
  auto line = peer.value().proc->ReadLine(seconds(10));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  unsigned long long next_addr = 0;
  const size_t at = line.value().find("\"addr\":");
  ASSERT_NE(at, std::string::npos) << line.value();
  ASSERT_EQ(std::sscanf(line.value().c_str() + at, "\"addr\":%llu", &next_addr), 1);
  const uint64_t next = MemfdMappings(owner)[next_addr];
  ASSERT_NE(next, 0u);
  auto followed = [&] {
    auto info = e.value()->GetSegmentInfo(s.value());
    return info.ok() && info.value().buffers.size() == 1 &&
           info.value().buffers[0].addr == next_addr;
  };
  for (int i = 0; i < 1000 && !followed(); ++i) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(followed()) << "the engine did not follow the peer's new buffer";
  EXPECT_TRUE(MapsInode(getpid(), next)) << "the new buffer is not mapped before a request";
  EXPECT_FALSE(MapsInode(getpid(), first)) << "the freed buffer is still mapped";
  auto served = RoundTrip(*e.value(), s.value(), next_addr + 4096, 64 << 10);
  EXPECT_EQ(served.first, "shm");
  EXPECT_EQ(served.second, "shm");
}

}  // namespace
}  // namespace ferry
