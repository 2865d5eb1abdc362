// A master rebuilt from its nodes (issue 17, point 4): each node mounts with
// the catalog of the complete objects whose bytes it holds, and the master
// takes an entry when
// - its key is valid, its extents lie in the node's regions, sum to its
//   size and overlap nothing taken already;
// - the key is unknown here and the entry comes from an older master (a
//   lower term): the object is rebuilt, with this replica; or
// - the key is known here with the same put (term and put id) and size,
//   complete: the replica joins it (a node that mounts later, or again).
// Anything else is refused and forgotten by the node: an object of this
// master's own term that it no longer knows was removed, evicted or lost
// with its node, and must not come back. Objects still being written at the
// failure are in no catalog, so their space is free here; the node's free
// space is fenced for a while when it mounted before (Master::Mount), since
// the old master's grants may still be written.
#include "common/log.h"
#include "store/master/master.h"

namespace ferry::store {

uint64_t Master::Recover(const std::string& node, uint64_t generation,
                         const std::vector<CatalogEntry>& catalog) {
  uint64_t taken = 0;
  for (const CatalogEntry& e : catalog) {
    if (RecoverOne(node, generation, e)) {
      ++taken;
    } else {
      (void)log_.Add(node, generation, /*forget=*/true, e);
    }
  }
  return taken;
}

bool Master::RecoverOne(const std::string& node, uint64_t generation, const CatalogEntry& e) {
  if (!CheckKey(e.key).ok() || e.size == 0 || e.size > options_.max_object_size ||
      e.extents.empty() || e.extents.size() > Space::kMaxExtents ||
      static_cast<uint8_t>(e.pin) > static_cast<uint8_t>(StorePin::kHard)) {
    return false;
  }
  std::vector<Extent> extents;
  uint64_t sum = 0;
  for (auto [addr, length] : e.extents) {
    if (length == 0 || length > e.size) return false;
    sum += length;
    extents.push_back({addr, length});
  }
  if (sum != e.size) return false;
  Shard& shard = ShardOf(e.key);
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(e.key);
  const auto now = Clock::now();
  if (it == shard.objects.end()) {
    if (e.term >= term()) return false;  // this master's own, since gone (or a newer one's)
    Allocation a;
    if (!space_.Claim(node, generation, extents, &a)) return false;
    Object o;
    o.size = e.size;
    o.replicas.push_back(std::move(a));
    o.complete = true;
    o.put_id = e.put_id;
    o.term = e.term;
    o.last_access = now;
    o.pin = e.pin;
    o.pin_until = now + e.pin_ttl;
    shard.objects.emplace(e.key, std::move(o));
    ++objects_;
    return true;
  }
  Object& o = it->second;
  if (!o.complete || o.term != e.term || o.put_id != e.put_id || o.size != e.size) return false;
  auto mine = std::find_if(o.replicas.begin(), o.replicas.end(),
                           [&](const Allocation& a) { return a.node == node; });
  if (mine != o.replicas.end() && mine->generation == generation) return false;  // listed twice
  Allocation a;
  if (!space_.Claim(node, generation, extents, &a)) return false;
  if (mine != o.replicas.end()) {
    *mine = std::move(a);  // the old mount's replica, confirmed: it moves to the new one
  } else {
    o.replicas.push_back(std::move(a));
  }
  return true;
}

}  // namespace ferry::store
