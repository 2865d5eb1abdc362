#include "store/rpc/catalog_wire.h"

#include "store/rpc/limits.h"

namespace ferry::store {

void ToProto(const CatalogEntry& e, v1::CatalogEntry* out) {
  out->set_key(e.key);
  out->set_size(e.size);
  for (auto [addr, length] : e.extents) {
    auto* r = out->add_extents();
    r->set_base(addr);
    r->set_size(length);
  }
  out->set_pin(static_cast<uint32_t>(e.pin));
  out->set_pin_ttl_ms(static_cast<uint64_t>(e.pin_ttl.count()));
  out->set_term(e.term);
  out->set_put_id(e.put_id);
}

Result<CatalogEntry> FromProto(const v1::CatalogEntry& in) {
  constexpr uint64_t kMaxTtlMs = 365ull * 24 * 3600 * 1000;
  if (!CheckKey(in.key()).ok() || in.size() == 0 || in.extents().empty() ||
      in.extents_size() > static_cast<int>(kMaxExtents) ||
      in.pin() > static_cast<uint32_t>(StorePin::kHard) || in.pin_ttl_ms() > kMaxTtlMs) {
    return Status::ProtocolError("malformed catalog entry");
  }
  CatalogEntry e{
      in.key(),  in.size(),  {}, static_cast<StorePin>(in.pin()), Millis(in.pin_ttl_ms()),
      in.term(), in.put_id()};
  uint64_t sum = 0;
  for (const auto& r : in.extents()) {
    if (r.base() == 0 || r.size() == 0 || r.size() > in.size() || r.base() + r.size() < r.base()) {
      return Status::ProtocolError("malformed catalog extent");
    }
    sum += r.size();
    e.extents.emplace_back(r.base(), r.size());
  }
  if (sum != in.size()) return Status::ProtocolError("catalog extents do not cover the value");
  return e;
}

}  // namespace ferry::store
