// Frame sequences on one connection of a real Listener (transfer/listener.h)
// with the tcp transport's target side (tcp/target.h) serving Write and Read
// on two adjacent registered ranges, over loopback. The input is the byte
// stream a peer sends, except that the address of a Write or Read is taken
// as an offset into the registered memory, so the fuzzer can aim at it.
//
// A model of the listener says what each frame must get: its reply (opcode,
// status, id, address, length; the descriptor's bytes; a read's bytes when
// no later write could have changed them), or the connection closed. The
// harness checks that the replies come in frame order and match, that the
// connection closes only where the model says, never stalls, and that the
// memory afterwards holds exactly the writes the model applied.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio.hpp>
#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

// The authenticated handshake (frame_wire.h, version 2) is landing as this
// is written; until it has, the listener's Hello takes no payload.
#if __has_include("transfer/handshake.h")
#define FUZZ_HANDSHAKE 1
#include "common/auth.h"
#else
#define FUZZ_HANDSHAKE 0
#endif

#include "fuzz.h"
#include "transfer/descriptor.h"
#include "transfer/frame_wire.h"
#include "transfer/listener.h"
#include "transfer/memory_registry.h"
#include "transfer/tcp/target.h"

namespace ferry {
namespace {

using fuzz::GetLe;
using fuzz::PutLe;
using wire::Header;
using wire::Opcode;

constexpr uint64_t kEpoch = 0x5eed;
// Two registrations side by side, [0, kSplit) and [kSplit, kMemBytes): a
// range across both is in neither.
constexpr uint64_t kMemBytes = 4096;
constexpr uint64_t kSplit = 1536;
constexpr auto kStall = std::chrono::seconds(5);  // far beyond any honest answer

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>(i * 131 + 7); }

struct Served {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  MemoryRegistry registry;
  // Its own heap block, so that ASan sees any access past either end.
  uint8_t* mem = new uint8_t[kMemBytes];
  std::vector<uint8_t> descriptor;
  std::unique_ptr<TcpTarget> target;
  std::unique_ptr<Listener> listener;
  std::thread thread;
  sockaddr_in addr{};
};

// Made once and never destroyed: libFuzzer exits with the io thread running.
Served& Serve() {
  static Served* s = [] {
    fuzz::QuietLogs();
    auto* s = new Served;
    const auto base = reinterpret_cast<uint64_t>(s->mem);
    FUZZ_CHECK(s->registry.Add({.addr = base, .length = kSplit}).ok(), "register");
    FUZZ_CHECK(s->registry.Add({.addr = base + kSplit, .length = kMemBytes - kSplit}).ok(),
               "register");
    SegmentDescriptor d;
    d.epoch = kEpoch;
    d.host_id = "fuzz";
    d.transports = {"tcp"};
    d.transport_blobs = {""};
    d.regions = {{.addr = base, .length = kSplit, .blobs = {""}},
                 {.addr = base + kSplit, .length = kMemBytes - kSplit, .blobs = {""}}};
    s->descriptor = EncodeDescriptor(d);
    s->target = std::make_unique<TcpTarget>(TcpTarget::Config{}, s->registry, nullptr);
    Listener::Config cfg;
    cfg.host = "127.0.0.1";
    cfg.epoch = kEpoch;
    cfg.max_connections = cfg.max_connections_per_source = 1 << 20;
    auto l = Listener::Start(s->io, cfg, [s] { return s->descriptor; }, {s->target.get()});
    FUZZ_CHECK(l.ok(), "%s", l.status().ToString().c_str());
    s->listener = std::move(l).value();
    s->addr.sin_family = AF_INET;
    s->addr.sin_port = htons(s->listener->port());
    s->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->thread = std::thread([s] { s->io.run(); });
    return s;
  }();
  return *s;
}

struct Expected {
  Header h;
  std::vector<uint8_t> payload;  // compared when check_payload
  bool check_payload = false;
};

// What the listener must do with the input, frame by frame.
struct Model {
  std::vector<uint8_t> stream;  // the bytes to send, addresses rebased
  std::vector<Expected> replies;
  bool closes = false;          // a frame the listener must refuse ends the stream
  bool ends_on_frame = true;    // no partial frame at the end
  bool unpredicted = false;     // replies past `replies` are not known
  std::vector<uint8_t> memory;  // the registered memory once every frame is served
};

// The status the target gives a range, `off` relative to the memory.
StatusCode Check(uint64_t off, uint64_t length) {
  if (length == 0) return StatusCode::kInvalidArgument;
  if (off >= kMemBytes) return StatusCode::kOutOfRange;
  const uint64_t end = off < kSplit ? kSplit : kMemBytes;
  return length <= end - off ? StatusCode::kOk : StatusCode::kOutOfRange;
}

Model Predict(const uint8_t* data, size_t size, uint64_t base) {
  Model m;
  m.memory.resize(kMemBytes);
  for (uint64_t i = 0; i < kMemBytes; ++i) m.memory[i] = Pattern(i);
  struct Read {
    size_t reply;
    uint64_t off, length;
  };
  std::vector<Read> reads;  // checked unless a later write overlaps them
  size_t pos = 0;
  while (pos < size) {
    if (size - pos < wire::kHeaderSize) {
      m.stream.insert(m.stream.end(), data + pos, data + size);
      m.ends_on_frame = false;
      break;
    }
    uint8_t head[wire::kHeaderSize];
    std::memcpy(head, data + pos, sizeof(head));
    pos += sizeof(head);
    const bool ranged = head[5] == static_cast<uint8_t>(Opcode::kWrite) ||
                        head[5] == static_cast<uint8_t>(Opcode::kRead);
    if (ranged) PutLe(head + 16, GetLe(head + 16, 8) + base, 8);
    m.stream.insert(m.stream.end(), head, head + sizeof(head));
    auto decoded = wire::DecodeHeader(head);
    if (!decoded.ok() || decoded.value().status != StatusCode::kOk) {
      m.closes = true;
      return m;
    }
    // Flags (byte 7) are the frame format's newest part, still settling:
    // such a frame and all after it are served unpredicted, checked only
    // for crashes, until the model learns them.
    if (head[7] != 0) {
      m.stream.insert(m.stream.end(), data + pos, data + size);
      m.unpredicted = true;
      return m;
    }
    const Header h = decoded.value();
    const uint64_t off = h.addr - base;
    switch (h.opcode) {
      case Opcode::kHello: {
#if FUZZ_HANDSHAKE
        // No secret here: a Hello carries nothing, or the nonce of an
        // initiator that has one, read so that it hears the answer.
        if (h.length != 0 && h.length != auth::kNonceBytes) {
          m.closes = true;
          return m;
        }
        const uint64_t n = std::min<uint64_t>(h.length, size - pos);
        m.stream.insert(m.stream.end(), data + pos, data + pos + n);
        pos += n;
        if (n < h.length) {
          m.ends_on_frame = false;
          return m;
        }
#endif
        const bool same = h.addr == 0 || h.addr == kEpoch;
        m.replies.push_back({{Opcode::kHelloAck,
                              same ? StatusCode::kOk : StatusCode::kPeerRestarted, h.id, kEpoch, 0},
                             {},
                             false});
        break;
      }
      case Opcode::kGetDescriptor:
        m.replies.push_back({{Opcode::kDescriptor, StatusCode::kOk, h.id, 0, 0}, {}, true});
        break;
      case Opcode::kWrite: {
        if (h.length > wire::kMaxPayload) {
          m.closes = true;
          return m;
        }
        const uint64_t n = std::min<uint64_t>(h.length, size - pos);
        m.stream.insert(m.stream.end(), data + pos, data + pos + n);
        const StatusCode st = Check(off, h.length);
        if (st == StatusCode::kOk) {
          // Received in place, so even a payload cut short changes what the
          // replies of earlier reads, still queued, may send.
          for (const Read& r : reads) {
            if (r.off < off + n && off < r.off + r.length) {
              m.replies[r.reply].check_payload = false;
            }
          }
        }
        if (n < h.length) {  // the payload is cut short: no reply
          m.ends_on_frame = false;
          return m;
        }
        if (st == StatusCode::kOk) std::memcpy(m.memory.data() + off, data + pos, n);
        pos += n;
        m.replies.push_back({{Opcode::kWriteAck, st, h.id, h.addr, 0}, {}, false});
        break;
      }
      case Opcode::kRead: {
        if (h.length > wire::kMaxPayload) {
          m.closes = true;
          return m;
        }
        const StatusCode st = Check(off, h.length);
        if (st != StatusCode::kOk) {
          m.replies.push_back({{Opcode::kReadData, st, h.id, h.addr, 0}, {}, false});
          break;
        }
        reads.push_back({m.replies.size(), off, h.length});
        m.replies.push_back({{Opcode::kReadData, st, h.id, h.addr, h.length},
                             {m.memory.begin() + off, m.memory.begin() + off + h.length},
                             true});
        break;
      }
      default:  // replies, and nothing a peer may send
        m.closes = true;
        return m;
    }
  }
  return m;
}

// Reads replies as they come and checks them against the model.
class Replies {
 public:
  Replies(const Model& m, const std::vector<uint8_t>& descriptor) : m_(m), desc_(descriptor) {}

  // Takes in bytes; checks every complete reply.
  void Take(const uint8_t* p, size_t n) {
    in_.insert(in_.end(), p, p + n);
    for (;;) {
      if (got_ == m_.replies.size() && m_.unpredicted) return;
      if (in_.size() - at_ < wire::kHeaderSize) return;
      auto h = wire::DecodeHeader(in_.data() + at_);
      FUZZ_CHECK(h.ok(), "reply %zu: %s", got_, h.status().ToString().c_str());
      const bool has_payload =
          (h.value().opcode == Opcode::kDescriptor || h.value().opcode == Opcode::kReadData) &&
          h.value().status == StatusCode::kOk;
      const uint64_t len = has_payload ? h.value().length : 0;
      if (in_.size() - at_ - wire::kHeaderSize < len) return;
      Check(h.value(), in_.data() + at_ + wire::kHeaderSize, len);
      at_ += wire::kHeaderSize + len;
      ++got_;
    }
  }
  size_t got() const { return got_; }
  bool partial() const { return at_ != in_.size(); }

 private:
  void Check(const Header& h, const uint8_t* payload, uint64_t len) {
    FUZZ_CHECK(got_ < m_.replies.size(), "a reply to no frame (opcode %d)",
               static_cast<int>(h.opcode));
    const Expected& e = m_.replies[got_];
    Header want = e.h;
    if (want.opcode == Opcode::kDescriptor) want.length = desc_.size();
    FUZZ_CHECK(h.opcode == want.opcode && h.status == want.status && h.id == want.id &&
                   h.addr == want.addr && h.length == want.length,
               "reply %zu: opcode %d status %d id %llu addr 0x%llx length %llu; expected "
               "opcode %d status %d id %llu addr 0x%llx length %llu",
               got_, static_cast<int>(h.opcode), static_cast<int>(h.status),
               static_cast<unsigned long long>(h.id), static_cast<unsigned long long>(h.addr),
               static_cast<unsigned long long>(h.length), static_cast<int>(want.opcode),
               static_cast<int>(want.status), static_cast<unsigned long long>(want.id),
               static_cast<unsigned long long>(want.addr),
               static_cast<unsigned long long>(want.length));
    if (!e.check_payload) return;
    const std::vector<uint8_t>& body = want.opcode == Opcode::kDescriptor ? desc_ : e.payload;
    FUZZ_CHECK(len == body.size() && std::equal(body.begin(), body.end(), payload),
               "reply %zu: wrong payload", got_);
  }

  const Model& m_;
  const std::vector<uint8_t>& desc_;
  std::vector<uint8_t> in_;
  size_t at_ = 0;
  size_t got_ = 0;
};

}  // namespace
}  // namespace ferry

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Served& s = Serve();
  const auto base = reinterpret_cast<uint64_t>(s.mem);
  const Model m = Predict(data, size, base);
  // The previous connection was closed by the listener, so nothing writes here.
  for (uint64_t i = 0; i < kMemBytes; ++i) s.mem[i] = Pattern(i);

  const int fd = fuzz::ConnectTo(s.addr);

  // Send and receive together: replies that nobody reads would stop the
  // listener reading. Once every reply the model expects is in, half-close:
  // the listener must then close too.
  Replies replies(m, s.descriptor);
  size_t sent = 0;
  bool shut = false, closed = false, reset = false;
  const auto stall = std::chrono::steady_clock::now() + kStall;
  while (!closed) {
    if (!shut && sent == m.stream.size() && replies.got() == m.replies.size()) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (sent < m.stream.size() ? POLLOUT : 0)), 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        stall - std::chrono::steady_clock::now());
    FUZZ_CHECK(left.count() > 0, "the listener stalled: %zu of %zu bytes sent, %zu of %zu replies",
               sent, m.stream.size(), replies.got(), m.replies.size());
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    if (p.revents & POLLOUT) {
      ssize_t n = send(fd, m.stream.data() + sent, m.stream.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        sent = m.stream.size();  // refused: what was not sent is of no use now
        FUZZ_CHECK(m.closes || m.unpredicted, "send: %s", std::strerror(errno));
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      uint8_t buf[64 << 10];
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) replies.Take(buf, static_cast<size_t>(n));
      if (n == 0) closed = true;
      if (n < 0 && errno != EAGAIN && errno != EINTR) closed = reset = true;
    }
  }
  close(fd);

  // A refused frame may cut the replies before it short; anything else must
  // have answered every frame, and close only once asked to.
  if (!m.closes && !m.unpredicted) {
    FUZZ_CHECK(!reset && !replies.partial() && replies.got() == m.replies.size() && shut,
               "closed after %zu of %zu replies%s", replies.got(), m.replies.size(),
               reset ? " (reset)" : "");
  }
  if (!m.closes && !m.unpredicted && m.ends_on_frame) {
    for (uint64_t i = 0; i < kMemBytes; ++i) {
      FUZZ_CHECK(s.mem[i] == m.memory[i], "memory at +%llu differs from the writes served",
                 static_cast<unsigned long long>(i));
    }
  }
  return 0;
}
