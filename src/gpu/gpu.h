// The GPU layer's view for everything above it. No CUDA type appears here:
// src/gpu is the only code that includes CUDA headers.
//
// Without CUDA at build time, or without a driver or device at run time (any
// error from cudaGetDeviceCount), there is no GPU: every pointer is host
// memory and the engine serves host memory only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::gpu {

enum class MemoryKind : uint8_t { kHostPageable = 0, kHostPinned = 1, kDevice = 2 };

struct MemoryInfo {
  MemoryKind kind = MemoryKind::kHostPageable;
  int device = -1;          // the owning GPU for kDevice
  uint64_t alloc_base = 0;  // kDevice: start of the whole allocation (for IPC export)
  uint64_t alloc_size = 0;
};

// Usable GPUs; 0 when there is none. Probed once per process.
int DeviceCount();

// One line for logs and tools: the runtime, the devices, or why there are none.
std::string Describe();

// Classifies [p, p+length) from its pointer attributes. Called once, when
// memory is registered, never per request.
MemoryInfo Classify(const void* p);

std::string_view MemoryKindName(MemoryKind kind);

// Page-locks host memory for asynchronous GPU copies (cudaHostRegister). Done at
// allocation or registration, never on a data path: it can synchronize the device.
// Returns false without a GPU or on failure; the memory then stays pageable.
bool PinHost(void* p, size_t length);
void UnpinHost(void* p);

// The CUDA IPC handle (64 bytes) of the allocation holding a device pointer,
// as classified; empty when it cannot be exported. Done at registration.
std::string ExportIpc(const MemoryInfo& info);
// Maps a peer's allocation on `device`. Can synchronize the device: call when
// a segment is opened, never on a data path. Close with CloseIpc.
Result<void*> OpenIpc(const std::string& handle, int device);
void CloseIpc(void* base, int device);
// Imports open in this process now, and opened since it started; for tests.
struct IpcImportCounts {
  int64_t open = 0;
  uint64_t opened = 0;
};
IpcImportCounts IpcImports();

// The physical reference of GPU benchmarks: GB/s of back-to-back
// cudaMemcpyAsync of `block` bytes on a private non-blocking stream, between
// buffers on `src_device` and `dst_device` (-1: page-locked host memory),
// synchronizing after every `per_sync` copies: 8 is a pipeline's rate, 1 the
// rate of copies each seen complete before the next is issued.
Result<double> CopyBandwidth(int src_device, int dst_device, size_t block, double seconds,
                             int per_sync = 8);

// The GPU's side of GPU memory over tcp, without the sockets: GB/s of
// `block`-byte copies from device `out_device` into page-locked memory and,
// at the same time on another stream, from page-locked memory into device
// `in_device` (-1 for either: that trip is not made), counting the bytes of
// one direction. A staged path cannot move GPU memory faster than this.
// InvalidArgument when both are -1. The host end is `span` bytes (at least
// one block) taken a block at a time in turn, so that a span the size of a
// staging pool is as far from the CPU's caches as the pool is. With `more`,
// the copies go on while it returns true, instead of for `seconds`; it is
// first asked after one round of copies.
Result<double> StagingBandwidth(int out_device, int in_device, size_t block, double seconds,
                                size_t span = 0, const std::function<bool()>& more = nullptr);

// GB/s of `block`-byte copies into device `device` from page-locked blocks
// this thread has just written, as a socket receive writes a landing's
// staging, then passed to WriteBackOwnForDma (common/cache.h) when
// `write_back`: the DMA's reads of lines a CPU holds. Timed on the GPU, so
// the CPU's writing is not counted. Beside StagingBandwidth's untouched
// blocks, it tells whether copies in slow down for such lines.
Result<double> CopyInFromWrittenBandwidth(int device, size_t block, double seconds,
                                          bool write_back);

// The staged end of GPU memory's raw tcp reference (`ferry bench transfer`):
// `block` bytes of device memory at a time are copied to or from one of two
// page-locked buffers on a private stream, so the copy through one buffer
// overlaps the socket call on the other, as a plain program staging by hand
// would do. Set up before the timed part.
class StagedPipe {
 public:
  // NotSupported without a GPU.
  static Result<std::unique_ptr<StagedPipe>> Create(int device, size_t block);
  virtual ~StagedPipe() = default;
  // Page-locked buffer `slot` (0 or 1) of `block` bytes.
  virtual char* buffer(int slot) = 0;
  // Enqueues buffer(slot) <- device `src` (Fetch) or device `dst` <-
  // buffer(slot) + at (Store), `n` <= block bytes, after the slot's earlier
  // copies.
  virtual Status Fetch(int slot, const void* src, size_t n) = 0;
  virtual Status Store(int slot, size_t at, void* dst, size_t n) = 0;
  // Blocks until the slot's copies are done.
  virtual Status Wait(int slot) = 0;
};

// Page-locked host memory (cudaMallocHost), for staging rings made when a
// segment is opened.
Result<void*> AllocPinned(size_t length);
void FreePinned(void* p);

// Device memory for tools and tests (`ferry serve --gpu-alloc`).
Result<void*> AllocDevice(size_t length, int device);
void FreeDevice(void* p);

}  // namespace ferry::gpu
