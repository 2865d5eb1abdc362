#include "store/node/catalog.h"

#include <set>
#include <string_view>
#include <tuple>

#include "common/crc32c.h"

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer's runtime: the calling thread's reads go unchecked between.
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace ferry::store {

// The bytes may be changing as they are read: the master can remove an object
// and reuse its space before its node lists it, and the checksum is what
// catches that (a mismatch drops the entry at the next mount). So the read is
// a race by design, and TSan is told to skip it; checking it would also cost
// a report per word (docs/testing.md).
uint32_t NodeCatalog::Crc(const CatalogEntry& e) const {
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  uint32_t crc = 0;
  for (auto [addr, length] : e.extents) {
    crc = crc32c::Extend(crc, reinterpret_cast<const void*>(addr), length);
  }
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  return crc;
}

Status NodeCatalog::Apply(const std::vector<CatalogChange>& changes) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < changes.size(); ++i) {
    if (changes[i].seq != acked_ + 1 + i) {
      return Status::ProtocolError("catalog change " + std::to_string(changes[i].seq) +
                                   " out of order after " + std::to_string(acked_ + i));
    }
  }
  // An object listed and forgotten in one batch is never checksummed: under
  // churn most are.
  std::set<std::tuple<std::string_view, uint64_t, uint64_t>> forgotten;
  for (const CatalogChange& c : changes) {
    if (c.forget) forgotten.emplace(c.entry.key, c.entry.term, c.entry.put_id);
  }
  for (const CatalogChange& c : changes) {
    const CatalogEntry& e = c.entry;
    acked_ = c.seq;
    auto it = entries_.find(e.key);
    const bool same = it != entries_.end() && it->second.entry.term == e.term &&
                      it->second.entry.put_id == e.put_id;
    if (c.forget) {
      if (same) entries_.erase(it);  // only the put named: a later one of the key stays
      continue;
    }
    if (same) {
      it->second.entry = e;  // a new pin; the same bytes
      continue;
    }
    if (forgotten.count({e.key, e.term, e.put_id}) > 0) continue;
    bool mine = true;
    for (auto [addr, length] : e.extents) mine = mine && owns_(addr, length);
    if (!mine) continue;
    entries_[e.key] = Listed{e, Crc(e)};
  }
  return Status::Ok();
}

size_t NodeCatalog::Verify() {
  std::lock_guard lock(mu_);
  return std::erase_if(entries_,
                       [&](const auto& kv) { return Crc(kv.second.entry) != kv.second.crc; });
}

void NodeCatalog::Restart() {
  std::lock_guard lock(mu_);
  acked_ = 0;
}

uint64_t NodeCatalog::acked() const {
  std::lock_guard lock(mu_);
  return acked_;
}

std::vector<CatalogEntry> NodeCatalog::Entries() const {
  std::lock_guard lock(mu_);
  std::vector<CatalogEntry> out;
  out.reserve(entries_.size());
  for (const auto& [key, l] : entries_) out.push_back(l.entry);
  return out;
}

size_t NodeCatalog::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace ferry::store
