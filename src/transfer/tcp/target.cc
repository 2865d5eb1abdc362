#include "transfer/tcp/target.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "common/cache.h"
#include "common/crc32c.h"
#include "common/event_trace.h"
#include "common/held_work.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/memory_registry.h"
#include "transfer/socket_write.h"
#include "transfer/tcp/socket_io.h"

namespace ferry {

using wire::Header;
using wire::Opcode;

// Host buffers for checksummed writes, reused so that a frame neither
// allocates nor faults in fresh pages; a few are kept, none over 4 MiB.
// Shared: a buffer returns here whenever its last holder lets go of it.
class TcpTarget::BouncePool : public std::enable_shared_from_this<BouncePool> {
 public:
  std::shared_ptr<std::vector<char>> Take(size_t n) {
    std::unique_ptr<std::vector<char>> b;
    {
      std::lock_guard lk(mu_);
      if (!free_.empty()) {
        b = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!b) b = std::make_unique<std::vector<char>>();
    if (b->size() < n) b->resize(n);
    return std::shared_ptr<std::vector<char>>(
        b.release(), [pool = shared_from_this()](std::vector<char>* v) { pool->Give(v); });
  }

 private:
  static constexpr size_t kKeep = 16;
  static constexpr size_t kKeepBytes = 4 << 20;

  void Give(std::vector<char>* v) {
    std::unique_ptr<std::vector<char>> b(v);
    if (b->size() > kKeepBytes) return;
    std::lock_guard lk(mu_);
    if (free_.size() < kKeep) free_.push_back(std::move(b));
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<std::vector<char>>> free_;  // guarded by mu_
};

TcpTarget::TcpTarget(const Config& config, const MemoryRegistry& registry, gpu::Copier* copier)
    : registry_(registry),
      copier_(copier),
      landing_(config.landing),
      land_hold_(config.land_hold),
      bounce_(std::make_shared<BouncePool>()) {
  if (copier_ != nullptr) {
    auto pool = StagingPool::Create(config.staging_buffers, config.staging_bytes);
    if (pool.ok()) {
      staging_ = std::move(pool).value();
    } else {
      FERRY_LOG_WARN("listener: no pinned staging for GPU memory: {}", pool.status().ToString());
    }
  }
}

bool TcpTarget::Serves(Opcode opcode) const {
  return opcode == Opcode::kWrite || opcode == Opcode::kRead;
}

void TcpTarget::Serve(FrameConnection& conn, const Header& h) {
  if (h.opcode == Opcode::kWrite) return HandleWrite(conn.self(), h);
  HandleRead(conn.self(), h);
}

StatusCode TcpTarget::Check(const Header& h, int* device) const {
  if (h.length == 0) return StatusCode::kInvalidArgument;
  auto r = registry_.Find(h.addr, h.length);
  if (!r) return StatusCode::kOutOfRange;
  *device = r->kind == gpu::MemoryKind::kDevice ? std::max(r->device, 0) : -1;
  if (*device >= 0 && (copier_ == nullptr || staging_ == nullptr)) return StatusCode::kNotSupported;
  return StatusCode::kOk;
}

void TcpTarget::HandleWrite(const Conn& c, const Header& h) {
  FERRY_TRACE(trace::kTargetHeader, h.addr);
  if (h.length > wire::kMaxPayload) return c->Drop("write payload too large");
  const bool crc = (h.flags & wire::kFlagCrc32c) != 0;
  const uint64_t on_wire = h.length + (crc ? wire::kCrcBytes : 0);
  int device = -1;
  StatusCode st = Check(h, &device);
  if (st == StatusCode::kOk && crc && device >= 0 && h.length > staging_->buffer_bytes()) {
    // Its pieces would land in the device before its sum could be checked.
    FERRY_LOG_WARN("listener: a checksummed GPU write over {} bytes is not supported",
                   staging_->buffer_bytes());
    st = StatusCode::kNotSupported;
  }
  if (st != StatusCode::kOk) {
    FERRY_LOG_WARN("listener: write from {} rejected: {} at 0x{:x}+{}", c->peer(),
                   StatusCodeName(st), h.addr, h.length);
    return Discard(c, h, on_wire, st, nullptr);
  }
  if (device >= 0) {
    if (h.length <= staging_->buffer_bytes()) return WriteToDevice(c, h, device);
    return Serially(c,
                    [this, c, h, device](char* buf) { WriteToDeviceSerial(c, h, device, buf, 0); });
  }
  if (crc) return WriteChecked(c, h);
  c->BeginFrame();
  // The receive that ends the payload takes the next header along.
  AsyncReadPayload(
      c->socket(), reinterpret_cast<char*>(h.addr), h.length, c->rcv_lowat(),
      [c, h](asio::error_code ec) {
        c->EndFrame();
        if (ec) return c->Shutdown();
        FERRY_TRACE(trace::kTargetPayload, h.addr);
        FERRY_TRACE(trace::kTargetAck, h.addr);
        c->Reply({Opcode::kWriteAck, StatusCode::kOk, h.id, h.addr, 0}, nullptr);
        c->ReadNext();
      },
      c->header_tail());
}

// A checksummed write to host memory lands in a bounce buffer first, so a
// payload that fails its sum never touches the registered memory: it is
// refused with ProtocolError, and the connection, still in step, reads on.
void TcpTarget::WriteChecked(const Conn& c, const Header& h) {
  // The trailer lands right after the payload: one receive for both.
  auto buf = bounce_->Take(h.length + wire::kCrcBytes);
  c->BeginFrame();
  AsyncReadPayload(c->socket(), buf->data(), h.length + wire::kCrcBytes, c->rcv_lowat(),
                   [c, h, buf](asio::error_code ec) {
                     c->EndFrame();
                     if (ec) return c->Shutdown();
                     const char* p = buf->data();
                     const bool ok = SumMatches(*c, h, p, p + h.length);
                     if (ok) std::memcpy(reinterpret_cast<char*>(h.addr), p, h.length);
                     c->Reply({Opcode::kWriteAck, ok ? StatusCode::kOk : StatusCode::kProtocolError,
                               h.id, h.addr, 0},
                              nullptr);
                     c->ReadNext();
                   });
}

// Whether the write's payload at `data` matches the CRC-32C `trailer`;
// a mismatch is logged.
bool TcpTarget::SumMatches(FrameConnection& c, const Header& h, const char* data,
                           const char* trailer) {
  if (wire::DecodeCrc(reinterpret_cast<const uint8_t*>(trailer)) == crc32c::Value(data, h.length)) {
    return true;
  }
  FERRY_LOG_WARN("listener: write from {} at 0x{:x}+{} failed its checksum; not applied", c.peer(),
                 h.addr, h.length);
  return false;
}

// Reads the CRC-32C trailer of the payload just received at `data` (into
// staging, which has no room for it), then `next`: OK when it matches,
// ProtocolError (logged) when not, ConnectionLost when the socket failed,
// the connection then closed.
void TcpTarget::ReadSum(const Conn& c, const Header& h, const char* data, Next next) {
  auto sum = std::make_shared<std::array<char, wire::kCrcBytes>>();
  c->BeginFrame();
  // Inline when the bytes are there, as they mostly are.
  AsyncReadPayload(c->socket(), sum->data(), sum->size(), c->rcv_lowat(),
                   [c, h, data, sum, next = std::move(next)](asio::error_code ec) {
                     c->EndFrame();
                     if (ec) {
                       c->Shutdown();
                       return next(Status::ConnectionLost("closed mid-frame"));
                     }
                     next(SumMatches(*c, h, data, sum->data())
                              ? Status::Ok()
                              : Status::ProtocolError("checksum mismatch"));
                   });
}

// Consumes a rejected write's payload so the stream stays in step.
void TcpTarget::Discard(const Conn& c, const Header& h, uint64_t left, StatusCode st,
                        std::shared_ptr<std::vector<char>> scratch) {
  if (left == 0) {
    c->Reply({Opcode::kWriteAck, st, h.id, h.addr, 0}, nullptr);
    return c->ReadNext();
  }
  if (!scratch) scratch = std::make_shared<std::vector<char>>(64 << 10);
  size_t n = std::min<uint64_t>(left, scratch->size());
  c->BeginFrame();
  asio::async_read(c->socket(), asio::buffer(scratch->data(), n),
                   [this, c, h, left, st, scratch](auto ec, size_t got) {
                     c->EndFrame();
                     if (ec) return c->Shutdown();
                     Discard(c, h, left - got, st, scratch);
                   });
}

void TcpTarget::HandleRead(const Conn& c, const Header& h) {
  FERRY_TRACE(trace::kTargetHeader, h.addr);
  if (h.length > wire::kMaxPayload) return c->Drop("read length too large");
  int device = -1;
  StatusCode st = Check(h, &device);
  if (st != StatusCode::kOk) {
    FERRY_LOG_WARN("listener: read from {} rejected: {} at 0x{:x}+{}", c->peer(),
                   StatusCodeName(st), h.addr, h.length);
    c->Reply({Opcode::kReadData, st, h.id, h.addr, 0}, nullptr);
    return c->ReadNext();
  }
  if (device >= 0) {
    if (h.length <= staging_->buffer_bytes()) return ReadFromDevice(c, h, device);
    return Serially(c, [this, c, h, device](char* buf) {
      ReadFromDeviceSerial(c, h, device, buf, 0, nullptr, 0);
    });
  }
  // A Read's flag asks for the checksum, which the reply's flag sends.
  FERRY_TRACE(trace::kTargetAck, h.addr);
  c->Reply({Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length, h.flags},
           reinterpret_cast<const void*>(h.addr));
  c->ReadNext();
}

// Runs `fn` on the connection's strand once a staging buffer is free. The
// connection reads no further frame meanwhile, which bounds what it holds.
void TcpTarget::WithStaging(const Conn& c, std::function<void(char*)> fn) {
  if (char* buf = staging_->TryTake()) return fn(buf);
  held::RunAll();  // landings held on this thread give buffers back
  staging_->Take([c, fn = std::move(fn)](char* buf) mutable {
    c->Post([buf, fn = std::move(fn)] { fn(buf); });
  });
}

// Runs `next` on the strand once the staged copy has landed, or failed.
// The copy is started on the landing pool where landing_threads makes one,
// else on this socket thread.
void TcpTarget::CopyThen(const Conn& c, void* dst, const void* src, size_t n, int device,
                         Next next) {
  auto copy = [copier = copier_, dst, src, n, device,
               done = OnStrand(c, std::move(next))]() mutable {
    copier->CopyAsync(dst, src, n, device, nullptr, std::move(done));
  };
  if (landing_ == nullptr) return copy();
  landing_->Post(std::move(copy));
}

// The same for a buffer just received; `pool` as for LandStaged.
void TcpTarget::LandThen(const Conn& c, void* dst, const char* buf, size_t n, int device,
                         ThreadPool* pool, Next next) {
  LandStaged(pool, *copier_, dst, buf, n, device, false, LandHold{}, nullptr,
             OnStrand(c, std::move(next)));
}

TcpTarget::Next TcpTarget::OnStrand(const Conn& c, Next next) {
  return [c, next = std::move(next)](const Status& st) { c->Post([st, next] { next(st); }); };
}

// A write into GPU memory that fits one staging buffer: receive it, start
// the copy to the device and read on; the ack goes out once it has
// landed (R3).
void TcpTarget::WriteToDevice(const Conn& c, const Header& h, int device) {
  auto out = c->Reserve();
  WithStaging(c, [this, c, h, device, out](char* buf) {
    c->BeginFrame();
    // Written back as it comes in (WriteBackEager), or whole once it has landed.
    const bool eager = WriteBackEager();
    AsyncReadPayload(
        c->socket(), buf, h.length, c->rcv_lowat(),
        [this, c, h, device, out, buf, eager](auto ec) {
          FERRY_TRACE(trace::kTargetPayload, h.addr);
          c->EndFrame();
          if (ec) {
            staging_->Give(buf);
            return c->Shutdown();
          }
          if ((h.flags & wire::kFlagCrc32c) == 0) {
            LandWrite(c, h, device, out, buf, eager);
            return c->ReadNext();
          }
          // Checked in staging, before anything reaches the device.
          ReadSum(c, h, buf, [this, c, h, device, out, buf, eager](const Status& st) {
            if (!st.ok()) {
              staging_->Give(buf);
              if (st.code() == StatusCode::kConnectionLost) return;
              c->Fill(out, {Opcode::kWriteAck, st.code(), h.id, h.addr, 0}, nullptr);
            } else {
              LandWrite(c, h, device, out, buf, eager);
            }
            c->ReadNext();
          });
        },
        nullptr, WriteBackAsFilled{eager ? buf : nullptr});
  });
}

// Starts the copy of a received write from staging to the device; its ack
// fills `out` once it has landed.
void TcpTarget::LandWrite(const Conn& c, const Header& h, int device,
                          const std::shared_ptr<FrameConnection::Slot>& out, char* buf,
                          bool written_back) {
  // Given back as soon as the copy is done, or only on the connection's
  // thread, where the ack may wait behind the frames that thread serves.
  const bool early = (EarlyRelease() & kReleaseOnLanding) != 0;
  auto ack = OnStrand(c, [this, c, h, out, buf, early](const Status& st) {
    FERRY_TRACE(trace::kTargetAck, h.addr);
    if (!early) staging_->Give(buf);
    if (!st.ok()) {
      FERRY_LOG_ERROR("listener: GPU write at 0x{:x} failed: {}", h.addr, st.ToString());
    }
    StatusCode code = st.ok() ? StatusCode::kOk : StatusCode::kInternal;
    c->Fill(out, {Opcode::kWriteAck, code, h.id, h.addr, 0}, nullptr);
  });
  LandStaged(landing_, *copier_, reinterpret_cast<void*>(h.addr), buf, h.length, device,
             written_back, land_hold_, nullptr,
             [this, buf, early, ack = std::move(ack)](const Status& st) {
               if (early) staging_->Give(buf);
               ack(st);
             });
}

// A read of GPU memory that fits one staging buffer: copy it device-to-host
// and read on; the reply is sent, in order, once the copy has landed.
void TcpTarget::ReadFromDevice(const Conn& c, const Header& h, int device) {
  auto out = c->Reserve();
  WithStaging(c, [this, c, h, device, out](char* buf) {
    CopyThen(c, buf, reinterpret_cast<const void*>(h.addr), h.length, device,
             [this, c, h, out, buf](const Status& st) {
               if (!st.ok()) {
                 staging_->Give(buf);
                 FERRY_LOG_ERROR("listener: GPU read at 0x{:x} failed: {}", h.addr, st.ToString());
                 return c->Fill(out, {Opcode::kReadData, StatusCode::kInternal, h.id, h.addr, 0},
                                nullptr);
               }
               FERRY_TRACE(trace::kTargetAck, h.addr);
               c->Fill(out, {Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length, h.flags},
                       buf, [this, buf] { staging_->Give(buf); });
             });
    c->ReadNext();
  });
}

// A frame larger than a staging buffer: once the replies before it are out,
// `piece` moves it through one buffer a piece at a time, and nothing else
// is sent (a write's ack, a read's pieces) or read until it is done.
void TcpTarget::Serially(const Conn& c, std::function<void(char*)> piece) {
  c->WhenDrained([this, c, piece = std::move(piece)] {
    WithStaging(c, [c, piece](char* buf) {
      c->HoldReplies(true);
      piece(buf);
    });
  });
}

void TcpTarget::WriteToDeviceSerial(const Conn& c, const Header& h, int device, char* buf,
                                    uint64_t off) {
  const size_t n = std::min<uint64_t>(h.length - off, staging_->buffer_bytes());
  c->BeginFrame();
  AsyncReadPayload(c->socket(), buf, n, c->rcv_lowat(), [this, c, h, device, buf, off, n](auto ec) {
    if (ec) {
      c->EndFrame();
      staging_->Give(buf);
      return c->Shutdown();
    }
    char* dst = reinterpret_cast<char*>(h.addr) + off;
    // Inline: nothing else is read on this connection meanwhile.
    LandThen(c, dst, buf, n, device, nullptr, [this, c, h, device, buf, off, n](const Status& st) {
      c->EndFrame();
      if (st.ok() && off + n < h.length) return WriteToDeviceSerial(c, h, device, buf, off + n);
      staging_->Give(buf);
      c->HoldReplies(false);
      if (!st.ok()) {
        FERRY_LOG_ERROR("listener: GPU write at 0x{:x} failed: {}", h.addr, st.ToString());
        return Discard(c, h, h.length - off - n, StatusCode::kInternal, nullptr);
      }
      c->Reply({Opcode::kWriteAck, StatusCode::kOk, h.id, h.addr, 0}, nullptr);
      c->ReadNext();
    });
  });
}

// The header goes out with the first piece, so a copy error before it can
// still be reported; after it, the connection is closed and the peer's
// request fails. A checksum asked for is summed piece by piece (`sum`) and
// goes out after the last.
void TcpTarget::ReadFromDeviceSerial(const Conn& c, const Header& h, int device, char* buf,
                                     uint64_t off, std::shared_ptr<uint8_t[]> header,
                                     uint32_t sum) {
  const size_t n = std::min<uint64_t>(h.length - off, staging_->buffer_bytes());
  const char* src = reinterpret_cast<const char*>(h.addr) + off;
  c->BeginFrame();
  CopyThen(
      c, buf, src, n, device, [this, c, h, device, buf, off, n, header, sum](const Status& st) {
        if (!st.ok()) {
          c->EndFrame();
          staging_->Give(buf);
          c->HoldReplies(false);
          FERRY_LOG_ERROR("listener: GPU read at 0x{:x} failed: {}", h.addr, st.ToString());
          if (off > 0) return c->Shutdown();
          c->Reply({Opcode::kReadData, StatusCode::kInternal, h.id, h.addr, 0}, nullptr);
          return c->ReadNext();
        }
        std::shared_ptr<uint8_t[]> head = header;  // the header, then room for the trailer
        if (off == 0) {
          head = std::make_shared<uint8_t[]>(wire::kHeaderSize + wire::kCrcBytes);
          wire::EncodeHeader({Opcode::kReadData, StatusCode::kOk, h.id, h.addr, h.length, h.flags},
                             head.get());
        }
        const bool crc = (h.flags & wire::kFlagCrc32c) != 0;
        const bool last = off + n == h.length;
        const uint32_t summed = crc ? crc32c::Extend(sum, buf, n) : 0;
        if (crc && last) wire::EncodeCrc(summed, head.get() + wire::kHeaderSize);
        std::array<asio::const_buffer, 3> bufs = {
            asio::buffer(head.get(), off == 0 ? wire::kHeaderSize : 0), asio::buffer(buf, n),
            asio::buffer(head.get() + wire::kHeaderSize, crc && last ? wire::kCrcBytes : 0)};
        AsyncWriteAll(c->socket(), bufs,
                      [this, c, h, device, buf, off, n, head, summed](auto ec, size_t) {
                        c->EndFrame();
                        if (!ec && off + n < h.length) {
                          return ReadFromDeviceSerial(c, h, device, buf, off + n, head, summed);
                        }
                        staging_->Give(buf);
                        c->HoldReplies(false);
                        if (ec) return c->Shutdown();
                        c->ReadNext();
                      });
      });
}

}  // namespace ferry
