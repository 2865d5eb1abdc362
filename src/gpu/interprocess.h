// Readiness across processes, for applications attached to their host's node
// (DESIGN.md, "Store", client): the application records an interprocess event
// on its own stream without blocking; the node opens the event and makes its
// private stream wait on it on the GPU, so neither CPU waits (R1, R2, R5).
// Everything here is created once and reused; nothing synchronizes a device.
#pragma once

#include <memory>
#include <string>

#include "ferry/status.h"

namespace ferry::gpu {

// Bytes of a CUDA IPC handle (memory or event).
inline constexpr size_t kIpcHandleBytes = 64;

// The application's side: one per device, reused by each call (a call
// records it and waits for the node's answer before the next one does).
class IpcEvent {
 public:
  // NotSupported without a GPU.
  static Result<std::unique_ptr<IpcEvent>> Create(int device);
  ~IpcEvent();
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;

  int device() const { return device_; }
  const std::string& handle() const { return handle_; }
  // Records the event on `stream` (a cudaStream_t of this device; null is the
  // legacy default stream) without blocking.
  Status Record(void* stream);
  // Waits on the CPU until the recorded work has finished: the blocking form
  // of readiness, for memory the node cannot import.
  Status Synchronize();

 private:
  IpcEvent(int device, void* event, std::string handle)
      : device_(device), event_(event), handle_(std::move(handle)) {}
  int device_;
  void* event_;
  std::string handle_;
};

// The node's side: a private non-blocking stream, and the peers' events it
// has opened.
class IpcStream {
 public:
  static Result<std::unique_ptr<IpcStream>> Create(int device);
  ~IpcStream();
  IpcStream(const IpcStream&) = delete;
  IpcStream& operator=(const IpcStream&) = delete;

  void* stream() const { return stream_; }
  int device() const { return device_; }
  // Makes later work on this stream wait, on the GPU, for a peer's event as
  // it stands now. The event is opened on first use and kept.
  Status WaitPeerEvent(const std::string& handle);

 private:
  IpcStream(int device, void* stream) : device_(device), stream_(stream) {}
  int device_;
  void* stream_;
  std::string opened_handle_;  // the one peer event kept open
  void* opened_ = nullptr;
};

// The device of `stream` (null: the calling thread's current device).
Result<int> StreamDevice(void* stream);
// Whether `stream` is being captured into a CUDA graph (DESIGN.md R5: work
// that must really run then is refused, never silently captured).
Result<bool> StreamCapturing(void* stream);
// Whether everything enqueued on `stream` (of `device`; null is the legacy
// default stream) has finished, without waiting: then memory it wrote is
// ready with no event (R1 orders by that stream's work alone). Never call it
// on a stream being captured, which it would invalidate.
Result<bool> StreamIdle(int device, void* stream);

// Enqueues a copy between host and device memory on `stream`, after the
// work already on it; returns at once.
Status CopyOnStream(void* dst, const void* src, size_t length, void* stream);
// Waits on the CPU until the work enqueued on `stream` so far has finished.
Status WaitStream(void* stream);
// CopyOnStream, then WaitStream. The fallback for GPU memory that cannot be
// shared by IPC.
Status CopyOnStreamAndWait(void* dst, const void* src, size_t length, void* stream);

}  // namespace ferry::gpu
