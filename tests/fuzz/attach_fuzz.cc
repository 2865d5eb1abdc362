// The attach socket (store/rpc/attach_wire.h, store/node/attach_server.cc):
// a real AttachServer over a real StoreCore, node and in-process master. Each
// input is what a client sends after its Hello and the Register of one
// sealed 64 KiB memfd (buffer 1): frames, good or bad, in any order.
//
// The harness checks that every reply answers the next request in order
// (type and id) with a well-formed frame and payload and no Internal status
// (a failure of the node's own, never the client's doing), that the server closes
// only at a malformed header (a ProtocolError is answered first), and that
// it never stalls.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "ferry/engine.h"
#include "fuzz.h"
#include "store/master/service.h"
#include "store/node/attach_server.h"
#include "store/node/core.h"
#include "store/node/node.h"
#include "store/rpc/attach_wire.h"
#include "store/rpc/master_client.h"

namespace ferry {
namespace {

namespace attach = store::attach;
using attach::Type;
using fuzz::GetLe;

constexpr uint64_t kBufferBytes = 64 << 10;
constexpr auto kStall = std::chrono::seconds(10);

struct Node {
  std::unique_ptr<store::MasterServer> master;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<store::StoreNode> node;
  std::unique_ptr<store::MasterClient> client;
  std::unique_ptr<store::StoreCore> core;
  std::unique_ptr<store::AttachServer> server;
  int memfd = -1;
};

template <typename T>
T Must(Result<T> r, const char* what) {
  FUZZ_CHECK(r.ok(), "%s: %s", what, r.status().ToString().c_str());
  return std::move(r).value();
}

// Made once and never destroyed: libFuzzer exits with its threads running.
Node& Serve() {
  static Node* n = [] {
    fuzz::QuietLogs();
    auto* n = new Node;
    store::MasterServerOptions mo;
    mo.http_port = -1;
    n->master = Must(store::MasterServer::Start(mo), "master");
    EngineOptions eo;
    eo.transport = "tcp";
    n->engine = Must(Engine::Create(eo), "engine");
    store::NodeOptions no;
    no.master = n->master->address();
    no.segment_size = 8 << 20;
    n->node = Must(store::StoreNode::Start(*n->engine, no, /*wait_for_mount=*/true), "node");
    n->client = Must(store::MasterClient::Connect(no.master, Millis(5000)), "client");
    n->core = std::make_unique<store::StoreCore>(*n->engine, *n->client, n->node.get(),
                                                 store::CoreOptions{});
    store::AttachOptions ao;
    ao.path = "/tmp/ferry-fuzz-attach-" + std::to_string(getpid()) + ".sock";
    ao.master = no.master;
    n->server = Must(store::AttachServer::Start(*n->core, ao), "attach server");
    n->memfd = memfd_create("ferry-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FUZZ_CHECK(n->memfd >= 0 && ftruncate(n->memfd, kBufferBytes) == 0 &&
                   fcntl(n->memfd, F_ADD_SEALS, F_SEAL_SHRINK) == 0,
               "memfd: %s", std::strerror(errno));
    return n;
  }();
  return *n;
}

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size());
  FUZZ_CHECK(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0, "connect: %s",
             std::strerror(errno));
  return fd;
}

attach::Frame Call(int fd, Type type, const std::vector<uint8_t>& payload, int pass_fd = -1) {
  FUZZ_CHECK(attach::Send(fd, type, 1, 1000, StatusCode::kOk, payload,
                          Deadline::After(Millis(5000)), pass_fd)
                 .ok(),
             "send");
  attach::Frame f =
      Must(attach::Receive(fd, Deadline::After(Millis(5000)), Millis(5000)), "setup reply");
  FUZZ_CHECK(f.code == StatusCode::kOk && f.type == type, "setup call %d answered %d",
             static_cast<int>(type), static_cast<int>(f.code));
  return f;
}

struct Request {
  uint16_t type;
  uint64_t id;
};

// The requests in the input, in order, as the server must frame them.
struct Model {
  std::vector<Request> requests;  // each with a valid header and its whole payload
  bool bad_header = false;        // then the server closes, unanswered, after those
};

Model Predict(const uint8_t* data, size_t size) {
  Model m;
  size_t pos = 0;
  while (size - pos >= attach::kHeaderBytes) {
    const uint8_t* h = data + pos;
    const uint64_t length = GetLe(h + 16, 4);
    const bool valid = GetLe(h, 4) == attach::kMagic && GetLe(h + 4, 2) == attach::kVersion &&
                       GetLe(h + 6, 2) >= 1 && GetLe(h + 6, 2) <= attach::kLastType &&
                       length <= attach::kMaxPayload &&
                       GetLe(h + 20, 4) <= attach::kMaxDeadlineMs &&
                       h[24] <= static_cast<uint8_t>(kLastStatusCode) && GetLe(h + 25, 3) == 0;
    if (!valid) {
      m.bad_header = true;
      break;
    }
    if (size - pos - attach::kHeaderBytes < length) break;  // cut short: no reply
    m.requests.push_back({static_cast<uint16_t>(GetLe(h + 6, 2)), GetLe(h + 8, 8)});
    pos += attach::kHeaderBytes + length;
  }
  return m;
}

// Whether `p` is a whole reply payload of `type` with code OK.
bool WellFormed(uint16_t type, const std::vector<uint8_t>& p) {
  ByteReader r(p.data(), p.size());
  // Internal is never the client's doing: it means a failure of the node's own.
  auto statuses = [&](bool get) {
    const uint32_t n = r.U32();
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      const uint8_t code = r.U8();
      if (code > static_cast<uint8_t>(kLastStatusCode) ||
          code == static_cast<uint8_t>(StatusCode::kInternal)) {
        return false;
      }
      r.Str(attach::kMaxMessage);
      if (get) r.U64(), r.U64();
    }
    return true;
  };
  switch (static_cast<Type>(type)) {
    case Type::kRegister: r.U32(); break;
    case Type::kUnregister:
    case Type::kHello: break;
    case Type::kPut:
    case Type::kExists:
    case Type::kRemove:
    case Type::kPin:
      if (!statuses(false)) return false;
      break;
    case Type::kGet:
      if (!statuses(true)) return false;
      break;
    case Type::kLocate: {
      const uint32_t n = r.U32();
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        const uint8_t code = r.U8();
        r.Str(attach::kMaxMessage);
        if (code != 0) continue;
        r.U64(), r.U64();
        const uint32_t reps = r.U32();
        for (uint32_t k = 0; k < reps && r.ok(); ++k) {
          r.U64();  // the replica's node epoch
          const uint32_t extents = r.U32();
          for (uint32_t e = 0; e < extents && r.ok(); ++e) r.Str(4096), r.U64(), r.U64();
        }
      }
      break;
    }
    case Type::kStats:
      for (int i = 0; i < 4; ++i) r.U64();
      break;
    case Type::kRemoveAll: r.U64(); break;
    default:  // the handshake's, which a node without a secret refuses
      return true;
  }
  return r.ok() && r.Left() == 0;
}

// Reads replies as they come and checks each against the next request.
class Replies {
 public:
  explicit Replies(const Model& m) : m_(m) {}

  void Take(const uint8_t* p, size_t n) {
    in_.insert(in_.end(), p, p + n);
    for (;;) {
      if (in_.size() - at_ < attach::kHeaderBytes) return;
      const uint8_t* h = in_.data() + at_;
      const uint64_t length = GetLe(h + 16, 4);
      if (in_.size() - at_ - attach::kHeaderBytes < length) return;
      FUZZ_CHECK(!ended_, "a reply after a ProtocolError");
      FUZZ_CHECK(got_ < m_.requests.size(), "a reply to no request");
      const Request& q = m_.requests[got_];
      const uint8_t code = h[24];
      FUZZ_CHECK(GetLe(h, 4) == attach::kMagic && GetLe(h + 4, 2) == attach::kVersion &&
                     GetLe(h + 6, 2) == q.type && GetLe(h + 8, 8) == q.id &&
                     GetLe(h + 20, 4) == 0 && code <= static_cast<uint8_t>(kLastStatusCode) &&
                     GetLe(h + 25, 3) == 0 && length <= attach::kMaxPayload,
                 "reply %zu: a bad header for type %d id %llu", got_, q.type,
                 static_cast<unsigned long long>(q.id));
      const std::vector<uint8_t> payload(h + attach::kHeaderBytes,
                                         h + attach::kHeaderBytes + length);
      FUZZ_CHECK(code != static_cast<uint8_t>(StatusCode::kInternal), "reply %zu: Internal", got_);
      if (code != 0) {
        ByteReader r(payload.data(), payload.size());
        r.Str(attach::kMaxMessage);
        FUZZ_CHECK(r.ok() && r.Left() == 0, "reply %zu: a bad error message", got_);
      } else {
        FUZZ_CHECK(WellFormed(q.type, payload), "reply %zu: a bad payload for type %d", got_,
                   q.type);
      }
      ended_ = code == static_cast<uint8_t>(StatusCode::kProtocolError);
      at_ += attach::kHeaderBytes + length;
      ++got_;
    }
  }
  size_t got() const { return got_; }
  bool ended() const { return ended_; }
  bool partial() const { return at_ != in_.size(); }

 private:
  const Model& m_;
  std::vector<uint8_t> in_;
  size_t at_ = 0;
  size_t got_ = 0;
  bool ended_ = false;  // a ProtocolError was answered: the server closes
};

}  // namespace
}  // namespace ferry

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Node& n = Serve();
  const Model m = Predict(data, size);
  const int fd = Connect(n.server->path());
  std::vector<uint8_t> hello;
  ByteWriter(&hello).U32(static_cast<uint32_t>(getpid()));
  Call(fd, Type::kHello, hello);
  std::vector<uint8_t> reg;
  ByteWriter(&reg).U64(kBufferBytes);
  Call(fd, Type::kRegister, reg, n.memfd);

  // Send and receive together, until every request is answered or the node
  // has said it closes. The harness closes then: the node closes its end
  // only when its accept loop next reaps the session, up to a second later.
  Replies replies(m);
  size_t sent = 0;
  bool closed = false;
  const auto stall = std::chrono::steady_clock::now() + kStall;
  while (!closed && !(sent == size && replies.got() == m.requests.size()) && !replies.ended()) {
    pollfd p{fd, static_cast<short>(POLLIN | (sent < size ? POLLOUT : 0)), 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        stall - std::chrono::steady_clock::now());
    FUZZ_CHECK(left.count() > 0, "the node stalled: %zu of %zu bytes sent, %zu of %zu replies",
               sent, size, replies.got(), m.requests.size());
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    if (p.revents & POLLOUT) {
      ssize_t k = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (k > 0) sent += static_cast<size_t>(k);
      if (k < 0 && errno != EAGAIN && errno != EINTR) sent = size;  // closed: checked below
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      uint8_t buf[64 << 10];
      ssize_t k = recv(fd, buf, sizeof(buf), 0);
      if (k > 0) replies.Take(buf, static_cast<size_t>(k));
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) closed = true;
    }
  }
  close(fd);
  // Closed unasked only at a malformed header, with every request before it
  // answered.
  FUZZ_CHECK(!closed || (m.bad_header && replies.got() == m.requests.size()),
             "closed after %zu of %zu replies", replies.got(), m.requests.size());
  FUZZ_CHECK(!replies.partial(), "a reply cut short");
  // Every input starts from an empty store.
  (void)n.core->RemoveAll(/*force=*/true);
  return 0;
}
