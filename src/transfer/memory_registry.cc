#include "transfer/memory_registry.h"

#include <mutex>
#include <string>

namespace ferry {

namespace {
std::string Hex(uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

Status MemoryRegistry::Add(const Region& r) {
  if (r.addr == 0 || r.length == 0) {
    return Status::InvalidArgument("registration needs a non-null address and length");
  }
  if (r.addr + r.length < r.addr) {
    return Status::InvalidArgument("registration wraps the address space");
  }
  std::unique_lock lk(mu_);
  auto next = regions_.lower_bound(r.addr);
  if (next != regions_.end() && next->first < r.addr + r.length) {
    return Status::AlreadyExists("range at " + Hex(r.addr) + " overlaps registration at " +
                                 Hex(next->first));
  }
  if (next != regions_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.length > r.addr) {
      return Status::AlreadyExists("range at " + Hex(r.addr) + " overlaps registration at " +
                                   Hex(prev->first));
    }
  }
  regions_.emplace(r.addr, r);
  return Status::Ok();
}

Result<Region> MemoryRegistry::Remove(uint64_t addr, bool owned) {
  std::unique_lock lk(mu_);
  auto it = regions_.find(addr);
  if (it == regions_.end()) {
    return Status::NotFound("no registration starts at " + Hex(addr));
  }
  if (it->second.owned != owned) {
    return Status::InvalidArgument(owned ? "memory not from AllocateMemory"
                                         : "memory from AllocateMemory is freed by FreeMemory");
  }
  Region r = it->second;
  regions_.erase(it);
  return r;
}

std::optional<Region> MemoryRegistry::Find(uint64_t addr, uint64_t length) const {
  if (length == 0 || addr + length < addr) return std::nullopt;
  std::shared_lock lk(mu_);
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return std::nullopt;
  --it;
  if (addr + length > it->first + it->second.length) return std::nullopt;
  return it->second;
}

std::vector<Region> MemoryRegistry::Snapshot() const {
  std::shared_lock lk(mu_);
  std::vector<Region> out;
  out.reserve(regions_.size());
  for (const auto& [addr, r] : regions_) out.push_back(r);
  return out;
}

}  // namespace ferry
