// The target side of the tcp transport: Write and Read frames on the
// engine's listener (frame_service.h). Every remote range is checked against
// this engine's registrations before memory is touched; a rejected write's
// payload is consumed so the stream stays in step.
//
// A write flagged with a checksum (frame_wire.h) is applied only once its
// payload matches its CRC-32C; else it is refused with ProtocolError and
// memory is left as it was. A flagged read is answered with the checksum.
//
// GPU memory of this process is staged: a write's payload lands in a pinned
// buffer and is copied to the device on a private stream before the ack (R3);
// a read is copied device-to-host first, then sent. Without a GPU such
// frames are refused with NotSupported.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "transfer/frame_service.h"
#include "transfer/tcp/staging.h"

namespace ferry {

class MemoryRegistry;
class ThreadPool;
namespace gpu {
class Copier;
}

class TcpTarget : public FrameService {
 public:
  struct Config {
    // Pinned staging for GPU memory, made here when there is a GPU. A
    // connection holds at most kMaxQueuedReplies of them.
    size_t staging_buffers = 16;
    size_t staging_bytes = 512 << 10;
    // Where the copies of staging start: received staging landed in GPU
    // memory (LandStaged), GPU memory staged for a reply. Null: on the
    // socket's thread. Must outlive the threads running the listener.
    ThreadPool* landing = nullptr;
    // LandHold (staging.h) for writes into GPU memory; only without
    // `landing`.
    LandHold land_hold;
  };

  // `copier` is null without a GPU; it and `registry` must outlive this.
  TcpTarget(const Config& config, const MemoryRegistry& registry, gpu::Copier* copier);

  bool Serves(wire::Opcode opcode) const override;
  void Serve(FrameConnection& conn, const wire::Header& h) override;

 private:
  using Conn = std::shared_ptr<FrameConnection>;
  using Next = std::function<void(const Status&)>;

  // The range's GPU when it is device memory, -1 for host memory.
  StatusCode Check(const wire::Header& h, int* device) const;
  void HandleWrite(const Conn& c, const wire::Header& h);
  void WriteChecked(const Conn& c, const wire::Header& h);
  void ReadSum(const Conn& c, const wire::Header& h, const char* data, Next next);
  static bool SumMatches(FrameConnection& c, const wire::Header& h, const char* data,
                         const char* trailer);
  void HandleRead(const Conn& c, const wire::Header& h);
  void Discard(const Conn& c, const wire::Header& h, uint64_t left, StatusCode st,
               std::shared_ptr<std::vector<char>> scratch);
  void WithStaging(const Conn& c, std::function<void(char*)> fn);
  void CopyThen(const Conn& c, void* dst, const void* src, size_t n, int device, Next next);
  void LandThen(const Conn& c, void* dst, const char* buf, size_t n, int device, ThreadPool* pool,
                Next next);
  static Next OnStrand(const Conn& c, Next next);
  void WriteToDevice(const Conn& c, const wire::Header& h, int device);
  // `written_back`: its receives wrote `buf` back as it came in.
  void LandWrite(const Conn& c, const wire::Header& h, int device,
                 const std::shared_ptr<FrameConnection::Slot>& out, char* buf, bool written_back);
  void ReadFromDevice(const Conn& c, const wire::Header& h, int device);
  void Serially(const Conn& c, std::function<void(char*)> piece);
  void WriteToDeviceSerial(const Conn& c, const wire::Header& h, int device, char* buf,
                           uint64_t off);
  void ReadFromDeviceSerial(const Conn& c, const wire::Header& h, int device, char* buf,
                            uint64_t off, std::shared_ptr<uint8_t[]> header, uint32_t sum);

  const MemoryRegistry& registry_;
  gpu::Copier* const copier_;
  ThreadPool* const landing_;
  const LandHold land_hold_;
  std::unique_ptr<StagingPool> staging_;  // null without a GPU
  class BouncePool;
  std::shared_ptr<BouncePool> bounce_;  // checksummed writes to host memory land here first
};

}  // namespace ferry
