#include "store/rpc/master_wire.h"

#include <algorithm>

#include "common/bytes.h"

namespace ferry::store::master_wire {

const char* MethodName(uint16_t type) {
  // Each name is a literal, so its data() ends in a NUL.
  return type >= kFirstMethod && type <= kLastType ? kMethods[type - kFirstMethod].data() : nullptr;
}

static_assert(TypeFor("PutBegin") == static_cast<uint16_t>(Type::kPutBegin) &&
              TypeFor("RemoveAll") == static_cast<uint16_t>(Type::kRemoveAll) &&
              TypeFor("Mount") == 0);

Result<std::vector<uint8_t>> EncodeRequest(std::string_view token, std::string_view body) {
  if (token.size() > kMaxToken) return Status::InvalidArgument("call token too long");
  std::vector<uint8_t> out;
  out.reserve(2 + token.size() + body.size());
  ByteWriter w(&out);
  w.U16(static_cast<uint16_t>(token.size()));
  out.insert(out.end(), token.begin(), token.end());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

Status DecodeRequest(std::span<const uint8_t> payload, std::string_view* token,
                     std::span<const uint8_t>* body) {
  if (payload.size() < 2) return Status::ProtocolError("master request cut short");
  ByteReader r(payload.data(), payload.size());
  const size_t n = r.U16();
  if (n > kMaxToken) return Status::ProtocolError("master request's token too long");
  if (payload.size() - 2 < n) return Status::ProtocolError("master request cut short");
  *token = std::string_view(reinterpret_cast<const char*>(payload.data()) + 2, n);
  *body = payload.subspan(2 + n);
  return Status::Ok();
}

std::vector<uint8_t> MessagePayload(std::string_view message) {
  message = message.substr(0, kMaxMessage);
  return std::vector<uint8_t>(message.begin(), message.end());
}

std::string ReplyMessage(std::span<const uint8_t> payload) {
  return std::string(reinterpret_cast<const char*>(payload.data()),
                     std::min(payload.size(), kMaxMessage));
}

}  // namespace ferry::store::master_wire
