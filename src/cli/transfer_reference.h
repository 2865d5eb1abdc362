// The physical references of `ferry bench transfer`, measured between the
// same two processes as the engine: raw loopback TCP streams, one per engine
// lane (with GPU memory, also the same streams staging it by hand), and a
// single-thread memcpy. The target serves its ends on a socket of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ferry::cli {

// --fresh at the target: frees the previous fresh buffer and sets up a new
// one of `bytes`, returning its address (0 on failure).
using FreshSource = std::function<uint64_t(uint64_t bytes)>;

// The target's side: accepts on `lfd` until it fails, each stream on a
// thread of its own. A stream that asks to stage does so in GPU `device`'s
// memory where that is 0 or more.
void ServeReference(int lfd, FreshSource fresh, int device);

// Asks the target at host:port for fresh memory of `bytes`; its address, 0
// on failure.
uint64_t AskFresh(const std::string& host, uint16_t port, uint64_t bytes);

// How a reference stream's ends hold their bytes.
struct RefMemory {
  uint64_t spread = 0;  // above one block: both ends cycle through that many bytes
  int device = -1;      // 0 or more: this end stages that GPU's memory
  bool staged = false;  // the target's end stages its GPU's memory, if it has one
  // The end that stages what it receives: writes each piece's cache lines
  // back before its copy into the GPU, as the engine does (common/cache.h),
  // and copies each `piece_kib` (0: the whole block; at most 65535) as soon
  // as it is in, not once the block is.
  bool write_back = false;
  uint64_t piece_kib = 0;
};

// The physical reference of tcp: `total` bytes written to (or read from)
// the target at host:port in `block`-sized socket calls over `streams` raw
// loopback TCP streams at once, as many as the engine's lanes, so both sides
// get the same parallelism. Timed from when every stream is set up. GB/s, 0
// on failure.
//
// With a `batch` of bytes, the streams move about `total` (whole batches)
// that many bytes at a time, shared out evenly, as the engine moves a
// batch: every stream's share of one batch is confirmed by the target (a
// byte back after a write's share, a byte asking for a read's) before any
// stream starts the next. The streams meet between batches without a
// wake-up, so this is the least a batch boundary costs raw sockets.
double ReferenceTcp(const std::string& host, uint16_t port, bool write, uint64_t total,
                    uint64_t block, int streams, const RefMemory& mem, uint64_t batch = 0);

// Can staging itself cost less? ReferenceTcp over `mem` (GPU memory staged
// by hand) with the receiving end changed: its write-back, whole and in 256
// and 64 KiB pieces, then 256 KiB pieces without it. Each with its GB/s.
struct StagedVariant {
  bool write_back;
  uint64_t piece_kib;
  double gbps;
};
std::vector<StagedVariant> ReferenceStagedVariants(const std::string& host, uint16_t port,
                                                   bool write, uint64_t total, uint64_t block,
                                                   int streams, const RefMemory& mem);

// GB/s of a single thread copying `block` bytes over and over for `seconds`.
double ReferenceMemcpy(uint64_t block, double seconds);

// GB/s of 64 KiB blocks that a thread on one CPU copies into a ring and a
// thread on another CPU copies out, for `seconds`: how fast bytes cross
// between two of the CPUs this process may use (the first two). Loopback tcp
// moves every byte across like that. A guest's vCPUs can sit on host cores
// far apart, and then this falls several-fold; taken before and after a
// run, it tells such runs apart. 0 with fewer than two CPUs.
double ReferenceCrossCpu(double seconds);

}  // namespace ferry::cli
