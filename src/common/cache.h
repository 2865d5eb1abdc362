// CPU cache control for buffers a device reads by DMA.
#pragma once

#include <cstddef>

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
// (read once per process, so it applies to every engine in it). With 2 it
// evicts the lines instead (CLFLUSHOPT, where the CPU has it), so the DMA
// reads them from memory: an experiment, for hosts other than the H200's.
// With 3 it only demotes them to the shared cache (CLDEMOTE, a hint that
// writes nothing to memory, where the CPU has it): an experiment.
void WriteBackForDma(const void* p, size_t n);
// The same without the closing fence: for a range written back in parts as
// a receive fills it, where the DMA that follows is no reason to wait for
// them (coherence never needed the write-back, only the DMA's speed).
void WriteBackForDmaUnfenced(const void* p, size_t n);
// What WriteBackForDma does in this process: 0 nothing, 1 write back, 2 evict,
// 3 demote.
int DmaWriteBackMode();
// InvalidArgument when FERRY_STAGING_WRITEBACK is set but not 0 to 3, so
// that Engine::Create refuses it; WriteBackForDma treats such a value as unset.
Status CheckWriteBackEnv();

}  // namespace ferry
