#include "store/rpc/attach_wire.h"

#include <utility>

#include "common/bytes.h"
#include "store/rpc/framing.h"

namespace ferry::store::attach {
namespace {

constexpr framing::Format kFormat{"attach",  kMagic,      kVersion,
                                  kLastType, kMaxPayload, kMaxDeadlineMs};

}  // namespace

Status Send(int sock, Type type, uint64_t id, uint32_t deadline_ms, StatusCode code,
            std::span<const uint8_t> payload, Deadline deadline, int fd) {
  return framing::Send(kFormat, sock, static_cast<uint16_t>(type), id, deadline_ms, code, payload,
                       deadline, fd);
}

Result<Frame> Receive(int sock, Deadline first_byte, Millis rest, std::chrono::microseconds spin) {
  FERRY_ASSIGN_OR_RETURN(framing::Frame f, framing::Receive(kFormat, sock, first_byte, rest, spin));
  Frame out;
  out.type = static_cast<Type>(f.type);
  out.id = f.id;
  out.deadline_ms = f.deadline_ms;
  out.code = f.code;
  out.payload = std::move(f.payload);
  out.fd = f.fd;
  return out;
}

std::vector<uint8_t> MessagePayload(const Status& st) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Str(st.message().substr(0, kMaxMessage));
  return out;
}

Status ReplyStatus(const Frame& reply) {
  if (reply.code == StatusCode::kOk) return Status::Ok();
  ByteReader r(reply.payload.data(), reply.payload.size());
  std::string msg = r.Str(kMaxMessage);
  if (!r.ok()) msg = "(no message)";
  return Status(reply.code, "node: " + msg);
}

auth::Mac NodeProof(const auth::Key& key, std::string_view client, std::string_view node) {
  return key.Sign("ferry attach v1 node", {auth::AsField(client), auth::AsField(node)});
}

auth::Mac ClientProof(const auth::Key& key, std::string_view client, std::string_view node) {
  return key.Sign("ferry attach v1 client", {auth::AsField(client), auth::AsField(node)});
}

}  // namespace ferry::store::attach
