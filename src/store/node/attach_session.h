// One attached client's connection, as the node serves it (attach_server.h
// accepts and reaps): the handshake, the client's buffers and GPU imports,
// and its requests, served in order on the session's own thread. The
// protocol is store/rpc/attach_wire.h's (docs/attach-protocol.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/log.h"
#include "ferry/status.h"
#include "gpu/gpu.h"
#include "gpu/interprocess.h"
#include "store/node/attach_server.h"
#include "store/node/core.h"
#include "store/rpc/attach_wire.h"

namespace ferry::store {

struct Mapping;  // a client's memfd, mapped and registered here

// One attached client: its buffers and its requests, served in order.
class AttachSession {
 public:
  // `peer` names the client in logs; `refusals` counts those the secret refuses.
  AttachSession(StoreCore& core, const AttachOptions& o, uint64_t instance, int fd,
                std::string peer, log::Refusals& refusals)
      : core_(core),
        o_(o),
        instance_(instance),
        fd_(fd),
        peer_(std::move(peer)),
        refusals_(refusals) {}

  void Run(bool admitted, const std::string& refusal);

 private:
  // The Hello reply's challenge and proof: empty without a secret. Sets
  // *nonce to the node's, which the client's Auth must answer.
  Status Challenge(const std::string& client_nonce, ByteWriter& w, std::string* nonce);
  // Whether `req`, the first request after a challenge, is an Auth that
  // answers it; if not, says why to the client and counts it.
  bool Authenticated(const attach::Frame& req, const std::string& client_nonce,
                     const std::string& nonce);
  // Handles one request: OK with the reply payload, or the call's status
  // (ProtocolError closes the connection).
  Status Handle(const attach::Frame& f, std::vector<uint8_t>* reply);
  Status Register(int fd, ByteReader& r, ByteWriter& w);
  Status Put(ByteReader& r, ByteWriter& w);
  Status Get(ByteReader& r, ByteWriter& w);
  Status KeyOp(attach::Type type, ByteReader& r, ByteWriter& w);
  Status Locate(ByteReader& r, ByteWriter& w);
  // The client memory [off, off+len) of buffer `id`, or null.
  uint8_t* Resolve(uint32_t id, uint64_t off, uint64_t len) const;
  // An item's parts: a count, then each one's kind and place: a registered
  // buffer (id, offset, length), or GPU memory of the client (device, IPC
  // handle, offset in the allocation, length). OK with the parts, or the
  // item's error; ProtocolError on a malformed count or kind.
  Status ReadParts(ByteReader& r, uint32_t min_parts, int gpu_device, std::vector<Part>* parts);
  // The GPU readiness of a request: the device its GPU parts are on (-1:
  // none) and, if the client recorded one, its event. Sets *stream to this
  // session's stream of that device, which waits for the event on the GPU.
  Status ReadReadiness(ByteReader& r, int* device, void** stream);
  // The client's allocation behind `handle`, imported once and kept until
  // the client goes (or the cache is full).
  Result<uint8_t*> Import(const std::string& handle, int device, uint64_t off, uint64_t len);
  std::vector<std::string> Keys(ByteReader& r, uint32_t n);

  StoreCore& core_;
  const AttachOptions& o_;
  const uint64_t instance_;
  const int fd_;
  const std::string peer_;
  log::Refusals& refusals_;
  uint32_t next_id_ = 1;
  std::map<uint32_t, std::shared_ptr<Mapping>> buffers_;
  struct Imported {
    uint8_t* base;
    int device;
    uint64_t size;
  };
  std::map<std::string, Imported> imports_;                 // by IPC handle
  std::map<int, std::unique_ptr<gpu::IpcStream>> streams_;  // by device

 public:
  ~AttachSession() {
    streams_.clear();
    for (auto& [handle, imp] : imports_) gpu::CloseIpc(imp.base, imp.device);
  }
};

}  // namespace ferry::store
