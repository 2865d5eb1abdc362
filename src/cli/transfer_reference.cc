// The raw references of `ferry bench transfer` (transfer_reference.h).
#include "cli/transfer_reference.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_util.h"
#include "common/cache.h"
#include "common/clock.h"
#include "common/cpu_claim.h"
#include "common/thread_name.h"
#include "gpu/gpu.h"

namespace ferry::cli {
namespace {

constexpr uint64_t kRefSink = 1, kRefSource = 2, kRefFresh = 3;
// Or'ed into a sink's or source's mode: the target's end stages its GPU's
// memory, where the target's buffer is on a GPU; a staging end that
// receives writes each piece's lines back before its copy (kRefWriteBack);
// it hands the GPU each piece of this many KiB (bits 16-31; 0, the whole
// block) as soon as it is in (RefMemory).
constexpr uint64_t kRefStaged = 1 << 8, kRefWriteBack = 1 << 9;
constexpr int kRefPieceShift = 16;
constexpr uint64_t kRefModeMask = 0xff;

uint64_t StagingBits(const RefMemory& mem) {
  return (mem.write_back ? kRefWriteBack : 0) | (mem.piece_kib << kRefPieceShift);
}

// One end of a reference stream: `span` bytes it cycles through, of host
// memory, or of a GPU's memory copied through a gpu::StagedPipe a block at a
// time, the copy of one block overlapping the socket call of the other.
class RefEnd {
 public:
  ~RefEnd() {
    pipe_.reset();
    if (dev_ != nullptr) gpu::FreeDevice(dev_);
  }

  // `device` -1: host memory. False when the memory cannot be had.
  // `staging`: StagingBits, for an end that stages what it receives.
  bool SetUp(int device, uint64_t span, uint64_t block, uint64_t staging = 0) {
    span_ = span;
    write_back_ = (staging & kRefWriteBack) != 0;
    piece_ = std::min<uint64_t>((staging >> kRefPieceShift & 0xffff) << 10, block);
    if (device < 0) {
      host_.assign(span, 1);
      return true;
    }
    auto dev = gpu::AllocDevice(span, device);
    if (!dev.ok()) return false;
    dev_ = static_cast<char*>(dev.value());
    auto pipe = gpu::StagedPipe::Create(device, block);
    if (pipe.ok()) pipe_ = std::move(pipe).value();
    return pipe_ != nullptr;
  }

  // Sends (`send`) or receives `total` bytes over `fd` in `block`-sized
  // socket calls. False on any error.
  bool Move(int fd, bool send, uint64_t total, uint64_t block) {
    if (pipe_ == nullptr) {
      uint64_t left = total, off = 0;
      bool ok = true;
      while (ok && left > 0) {
        const size_t n = std::min<uint64_t>(left, block);
        ok = send ? WriteAll(fd, host_.data() + off, n) : ReadAll(fd, host_.data() + off, n);
        left -= n;
        off = (off + block) % span_;
      }
      return ok;
    }
    return send ? SendStaged(fd, total, block) : ReceiveStaged(fd, total, block);
  }

 private:
  // Block i+1 is fetched while block i is sent.
  bool SendStaged(int fd, uint64_t total, uint64_t block) {
    uint64_t left = total, off = 0;
    size_t n = std::min<uint64_t>(left, block);
    int slot = 0;
    bool ok = left == 0 || (pipe_->Fetch(slot, dev_, n).ok() && pipe_->Wait(slot).ok());
    while (ok && left > 0) {
      const size_t cur = n;
      left -= cur;
      off = (off + block) % span_;
      n = std::min<uint64_t>(left, block);
      if (left > 0) ok = pipe_->Fetch(slot ^ 1, dev_ + off, n).ok();
      ok = ok && WriteAll(fd, pipe_->buffer(slot), cur);
      if (ok && left > 0) ok = pipe_->Wait(slot ^ 1).ok();
      slot ^= 1;
    }
    return ok;
  }

  // Block i is stored while block i+1 is received; a buffer is reused once
  // its store is done. With pieces, each is stored once it is in, while its
  // lines may still be in this core's cache. Returns once every block is in
  // device memory.
  bool ReceiveStaged(int fd, uint64_t total, uint64_t block) {
    uint64_t left = total, off = 0;
    bool ok = true;
    for (int slot = 0; ok && left > 0; slot ^= 1) {
      const size_t n = std::min<uint64_t>(left, block);
      ok = pipe_->Wait(slot).ok();
      for (size_t at = 0; ok && at < n;) {
        const size_t p = std::min<size_t>(n - at, piece_ > 0 ? piece_ : n);
        char* in = pipe_->buffer(slot) + at;
        ok = ReadAll(fd, in, p);
        if (ok && write_back_) WriteBackOwnForDma(in, p);
        ok = ok && pipe_->Store(slot, at, dev_ + off + at, p).ok();
        at += p;
      }
      left -= n;
      off = (off + block) % span_;
    }
    return ok && pipe_->Wait(0).ok() && pipe_->Wait(1).ok();
  }

  uint64_t span_ = 0;
  bool write_back_ = false;
  uint64_t piece_ = 0;  // bytes; 0: the whole block
  std::vector<char> host_;
  char* dev_ = nullptr;
  std::unique_ptr<gpu::StagedPipe> pipe_;
};

// The target's side of the raw reference: each stream on a thread of its own.
// A command is {mode u64, total u64, block u64, spread u64, round u64},
// answered with one byte once its buffer is set up (untimed, as the engine's
// memory is), or not at all when it cannot be; a sink answers another byte
// after `total`. With a round, the stream moves `total` that many bytes at a
// time: a sink answers a byte after each, a source waits for one before each.
// Blocks cycle through `spread` bytes (at least one block): see
// ReferenceStream. With kRefStaged in the mode, they do so in the memory of
// GPU `device` where that is 0 or more.
// A fresh command is {kRefFresh, bytes, 0, 0, 0}, answered with the address.
void ServeReferenceStream(int fd, const FreshSource& fresh, int device) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  uint64_t cmd[5];
  const bool got = ReadAll(fd, cmd, sizeof(cmd));
  const uint64_t mode = got ? cmd[0] & kRefModeMask : 0;
  if (mode == kRefFresh) {
    const uint64_t addr = cmd[1] > 0 && cmd[1] <= (8ull << 30) ? fresh(cmd[1]) : 0;
    WriteAll(fd, &addr, sizeof(addr));
  } else if ((mode == kRefSink || mode == kRefSource) && cmd[2] > 0 && cmd[2] <= (1ull << 30) &&
             cmd[3] <= (8ull << 30)) {
    const uint64_t block = cmd[2], span = std::max(block, cmd[3] / block * block);
    const uint64_t round = cmd[4] > 0 ? cmd[4] : cmd[1];
    RefEnd end;
    char ready = 1;
    bool ok = end.SetUp((cmd[0] & kRefStaged) != 0 ? device : -1, span, block, cmd[0]) &&
              WriteAll(fd, &ready, 1);
    for (uint64_t left = cmd[1]; ok && left > 0;) {
      const uint64_t n = std::min(left, round);
      if (mode == kRefSource) {
        ok = (cmd[4] == 0 || ReadAll(fd, &ready, 1)) && end.Move(fd, true, n, block);
      } else {
        ok = end.Move(fd, false, n, block) && (cmd[4] == 0 || WriteAll(fd, &ready, 1));
      }
      left -= n;
    }
    if (ok && mode == kRefSink) WriteAll(fd, &ready, 1);
  }
  close(fd);
}

// A connection to the target's reference socket, -1 on failure.
int ConnectReference(const std::string& host, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Where the streams of a batched reference (ReferenceTcp's `batch`) meet
// between batches: each counts the rounds it has finished and yields until
// every stream has finished as many, so the barrier costs no wake-up.
struct Rounds {
  int streams = 1;
  uint64_t round = 0;  // this stream's bytes of a batch; 0: not batched
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};

  // This stream has finished its `n`-th round (from 1), `ok` or not: true
  // once every stream has, false if any failed.
  bool Meet(uint64_t n, bool ok) {
    if (!ok) failed = true;
    done.fetch_add(1);
    const uint64_t all = n * static_cast<uint64_t>(streams);
    while (!failed.load() && done.load(std::memory_order_acquire) < all) {
      std::this_thread::yield();  // a stream still moving may need this core
    }
    return !failed.load();
  }
};

// One raw stream of `total` bytes in `block`-sized sends (write) or receives
// (read). With a spread, both ends cycle through that many bytes, as the
// engine's batch does through its buffers, instead of one hot block. Both
// ends set up their memory, then the stream waits for `go`, so no page fault
// falls in the timed part. With rounds, it moves `round` bytes at a time,
// each confirmed by the target's byte (a write) or asked for with one (a
// read), and waits for the other streams between them. False on any socket
// or copy error.
bool ReferenceStream(const std::string& host, uint16_t port, bool write, uint64_t total,
                     uint64_t block, const RefMemory& mem, std::atomic<int>& ready,
                     const std::atomic<bool>& go, Rounds& rounds) {
  const int fd = ConnectReference(host, port);
  block = std::min<uint64_t>(block, 1ull << 30);
  const uint64_t span = std::max(block, mem.spread / block * block);
  RefEnd end;
  bool ok = fd >= 0 && end.SetUp(mem.device, span, block, StagingBits(mem));
  if (ok) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint64_t cmd[5] = {
        (write ? kRefSink : kRefSource) | (mem.staged ? kRefStaged | StagingBits(mem) : 0), total,
        block, span, rounds.round};
    char peer_ready;
    ok = WriteAll(fd, cmd, sizeof(cmd)) && ReadAll(fd, &peer_ready, 1);
  }
  ready.fetch_add(1);  // failed or not: the others must not wait on it
  while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
  // Unbatched, one round of everything, neither confirmed nor met.
  const bool batched = rounds.round > 0;
  const uint64_t round = batched ? rounds.round : total;
  char done = 1;
  for (uint64_t left = total, n = 0, i = 1; ok && left > 0; left -= n, ++i) {
    n = std::min(left, round);
    ok = write ? end.Move(fd, true, n, block) && (!batched || ReadAll(fd, &done, 1))
               : (!batched || WriteAll(fd, &done, 1)) && end.Move(fd, false, n, block);
    if (batched) ok = rounds.Meet(i, ok);
  }
  // A stream that failed before its first round must not leave the others waiting.
  if (!ok) rounds.failed = true;
  if (ok && write) ok = ReadAll(fd, &done, 1);
  if (fd >= 0) close(fd);
  return ok;
}

// A reference stream's thread name, so that a profile of the whole bench
// (scripts/gpu-profile) tells its phases apart from the engine's threads:
// ref-raw, ref-staged, ref-staged-wb, ref-p256, ref-p64-wb, ...
std::string RefThreadName(const RefMemory& m) {
  if (m.device < 0) return "ref-raw";
  std::string name = m.piece_kib > 0 ? "ref-p" + std::to_string(m.piece_kib) : "ref-staged";
  return m.write_back ? name + "-wb" : name;
}

}  // namespace

void ServeReference(int lfd, FreshSource fresh, int device) {
  for (;;) {
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    std::thread([fd, fresh, device] {
      NameThisThread("ref-serve");
      ServeReferenceStream(fd, fresh, device);
    }).detach();
  }
}

uint64_t AskFresh(const std::string& host, uint16_t port, uint64_t bytes) {
  const int fd = ConnectReference(host, port);
  if (fd < 0) return 0;
  uint64_t cmd[5] = {kRefFresh, bytes, 0, 0, 0}, addr = 0;
  const bool ok = WriteAll(fd, cmd, sizeof(cmd)) && ReadAll(fd, &addr, sizeof(addr));
  close(fd);
  return ok ? addr : 0;
}

double ReferenceTcp(const std::string& host, uint16_t port, bool write, uint64_t total,
                    uint64_t block, int streams, const RefMemory& mem, uint64_t batch) {
  const auto n_streams = static_cast<uint64_t>(streams);
  Rounds rounds;
  rounds.streams = streams;
  if (batch > 0) {
    // Whole batches, each shared out evenly.
    rounds.round = std::max<uint64_t>(batch / n_streams, 1);
    total = std::max<uint64_t>(total / (rounds.round * n_streams), 1) * rounds.round * n_streams;
  }
  const uint64_t share = total / n_streams;
  std::atomic<int> failed{0}, ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    const uint64_t n = i + 1 < streams ? share : total - share * static_cast<uint64_t>(i);
    threads.emplace_back([&, n] {
      NameThisThread(RefThreadName(mem).c_str());
      if (!ReferenceStream(host, port, write, n, block, mem, ready, go, rounds)) {
        failed.fetch_add(1);
      }
    });
  }
  while (ready.load() < streams) std::this_thread::yield();
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  double secs = SecondsSince(t0);
  return failed.load() == 0 ? static_cast<double>(total) / secs / 1e9 : 0;
}

std::vector<StagedVariant> ReferenceStagedVariants(const std::string& host, uint16_t port,
                                                   bool write, uint64_t total, uint64_t block,
                                                   int streams, const RefMemory& mem) {
  std::vector<StagedVariant> out = {{true, 0, 0}, {true, 256, 0}, {true, 64, 0}, {false, 256, 0}};
  for (StagedVariant& v : out) {
    RefMemory m = mem;
    m.write_back = v.write_back;
    m.piece_kib = v.piece_kib;
    v.gbps = ReferenceTcp(host, port, write, total, block, streams, m);
  }
  return out;
}

double ReferenceMemcpy(uint64_t block, double seconds) {
  std::vector<char> src(block, 3), dst(block, 0);
  std::memcpy(dst.data(), src.data(), block);  // fault the pages in first
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  do {
    std::memcpy(dst.data(), src.data(), block);
    bytes += block;
  } while (SecondsSince(t0) < seconds);
  volatile char sink = dst[block / 2];
  (void)sink;
  return static_cast<double>(bytes) / SecondsSince(t0) / 1e9;
}

double ReferenceCrossCpu(double seconds) {
  const std::vector<int> cpus = cpus::Allowed();
  if (cpus.size() < 2) return 0;
  constexpr size_t kBlock = 64 << 10, kSlots = 16;
  std::vector<char> ring(kBlock * kSlots, 0), src(kBlock, 3), dst(kBlock, 0);
  std::vector<std::atomic<bool>> full(kSlots);
  for (auto& f : full) f.store(false);
  std::atomic<bool> stop{false};
  uint64_t taken = 0;
  // Each side spins on its slot's flag, checking `stop`, so neither outlives
  // the timer below.
  auto side = [&](int cpu, bool producer) {
    (void)cpus::PinThread(pthread_self(), cpu);
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      std::atomic<bool>& f = full[i % kSlots];
      while (f.load(std::memory_order_acquire) == producer) {
        if (stop.load(std::memory_order_relaxed)) return;
      }
      char* slot = ring.data() + (i % kSlots) * kBlock;
      if (producer) {
        std::memcpy(slot, src.data(), kBlock);
      } else {
        std::memcpy(dst.data(), slot, kBlock);
        taken = i + 1;
      }
      f.store(producer, std::memory_order_release);
    }
  };
  auto t0 = Clock::now();
  std::thread in(side, cpus[0], true), out(side, cpus[1], false);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  in.join();
  out.join();
  return static_cast<double>(taken * kBlock) / SecondsSince(t0) / 1e9;
}

}  // namespace ferry::cli
