// CPU cache control for buffers a device reads by DMA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/status.h"

namespace ferry {

// Writes the dirty cache lines of [p, p+n) back to memory, leaving them
// cached (CLWB), before a device reads the range by DMA. Any thread may call
// it; the one that filled the range is the cheapest, as it holds the lines.
//
// Why: on the H200 machine, a GPU copy out of a staging buffer that a socket
// receive had just filled slowed that receiving side's TCP by about a quarter,
// while the same copies out of an untouched buffer cost nothing. The DMA reads
// had to fetch the lines from the receiving core's private cache. Written back
// first, GPU-to-GPU tcp went from 7.35-7.80 to 8.62-9.06 GB/s for writes and
// from 7.13-7.33 to 7.96 GB/s for reads. (Evicting the lines instead, or also
// on the sending side, measured worse.)
//
// Does nothing where the CPU has no CLWB, or with FERRY_STAGING_WRITEBACK=0
// (read once per process, so it applies to every engine in it). With 1 every
// write-back is a CLWB, as before 2026-12-07. With 2 it evicts the lines
// instead (CLFLUSHOPT, where the CPU has it), so the DMA reads them from
// memory; with 3 it only demotes them to the shared cache (CLDEMOTE, where
// the CPU has it): experiments. 4, the default, is 1 but for
// WriteBackOwnForDma.
void WriteBackForDma(const void* p, size_t n);
// The same, called by the thread whose receive filled the range: in the
// default mode, where the CPU has CLDEMOTE, its lines are only demoted from
// this core's caches to the shared one, which writes nothing to memory. On
// two H100 leases (2026-12-07) that moved reads into GPU memory over tcp,
// landed on their socket thread, 5-8% (three probes) against CLWB, which
// costs that thread about 7 ns a line; a demote from another thread's
// core lost (writes landed at a target: 19.93 -> 16.16 GB/s), as its
// lines are not there.
void WriteBackOwnForDma(const void* p, size_t n);
// WriteBackOwnForDma without the closing fence: for a range written back in
// parts as a receive fills it, where the DMA that follows is no reason to
// wait for them (coherence never needed the write-back, only the DMA's
// speed).
void WriteBackOwnForDmaUnfenced(const void* p, size_t n);

// A receive's progress callback (transfer/tcp/socket_io.h) that writes each
// part back, unfenced, as it is filled, from `at` on. Null `at`: nothing.
struct WriteBackAsFilled {
  char* at = nullptr;
  void operator()(uint64_t n) {
    if (at == nullptr) return;
    WriteBackOwnForDmaUnfenced(at, n);
    at += n;
  }
};

// What WriteBackForDma does in this process: 0 nothing, 1 write back, 2 evict,
// 3 demote, 4 write back or demote one's own (the default).
int DmaWriteBackMode();
// InvalidArgument when FERRY_STAGING_WRITEBACK is set but not 0 to 4, so
// that Engine::Create refuses it; WriteBackForDma treats such a value as unset.
Status CheckWriteBackEnv();

}  // namespace ferry
