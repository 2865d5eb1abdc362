#include "store/master/space.h"

#include <algorithm>

namespace ferry::store {

uint64_t Space::Node::free_bytes() const {
  uint64_t n = 0;
  for (const auto& s : slabs) n += s.alloc.free_bytes();
  return n;
}

Result<uint64_t> Space::Mount(const std::string& node, uint64_t epoch,
                              const std::vector<Region>& regions, uint64_t* replaced) {
  *replaced = 0;
  if (epoch == 0) return Status::InvalidArgument("a mount needs the node's engine epoch");
  if (regions.empty() || regions.size() > kMaxRegions) {
    return Status::InvalidArgument("a mount needs 1 to " + std::to_string(kMaxRegions) +
                                   " regions");
  }
  std::vector<Region> sorted = regions;
  std::sort(sorted.begin(), sorted.end(),
            [](const Region& a, const Region& b) { return a.base < b.base; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Region& r = sorted[i];
    if (r.base == 0 || r.size < OffsetAllocator::kAlign || r.base + r.size < r.base) {
      return Status::InvalidArgument("region " + std::to_string(i) +
                                     " is null, smaller than 64 bytes or wraps");
    }
    if (i > 0 && sorted[i - 1].base + sorted[i - 1].size > r.base) {
      return Status::InvalidArgument("regions overlap");
    }
  }
  std::lock_guard lock(mu_);
  if (auto it = nodes_.find(node); it != nodes_.end()) {
    *replaced = it->second.generation;
    nodes_.erase(it);
  }
  Node n;
  n.generation = next_generation_++;
  n.epoch = epoch;
  n.last_seen = Clock::now();
  for (const Region& r : sorted) n.slabs.push_back(Slab{r, OffsetAllocator(r.size)});
  const uint64_t gen = n.generation;
  nodes_.emplace(node, std::move(n));
  return gen;
}

bool Space::Touch(const std::string& node) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return false;
  it->second.last_seen = Clock::now();
  return true;
}

uint64_t Space::Unmount(const std::string& node) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return 0;
  const uint64_t gen = it->second.generation;
  nodes_.erase(it);
  return gen;
}

std::vector<std::pair<std::string, uint64_t>> Space::Expire(Clock::time_point cutoff) {
  std::vector<std::pair<std::string, uint64_t>> out;
  // One pass under the lock: a heartbeat is either before it (the node stays)
  // or finds the node gone (and it mounts again).
  std::lock_guard lock(mu_);
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (it->second.last_seen < cutoff) {
      out.emplace_back(it->first, it->second.generation);
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

bool Space::AllocateOn(Node& node, uint64_t size, std::vector<Extent>* out) {
  out->clear();
  for (auto& s : node.slabs) {
    if (auto off = s.alloc.Allocate(size)) {
      out->push_back({s.region.base + *off, size});
      return true;
    }
  }
  if (node.free_bytes() < OffsetAllocator::RoundUp(size)) return false;
  // Fragmented: gather the largest free blocks.
  uint64_t left = size;
  while (left > 0 && out->size() < kMaxExtents) {
    Slab* best = nullptr;
    for (auto& s : node.slabs) {
      if (best == nullptr || s.alloc.largest_free() > best->alloc.largest_free()) best = &s;
    }
    const uint64_t take = std::min(left, best->alloc.largest_free());
    if (take == 0) break;
    auto off = best->alloc.Allocate(take);
    if (!off) break;
    out->push_back({best->region.base + *off, take});
    left -= take;
  }
  if (left == 0) return true;
  FreeOn(node, *out);
  out->clear();
  return false;
}

void Space::FreeOn(Node& node, const std::vector<Extent>& extents) {
  for (const Extent& e : extents) {
    for (auto& s : node.slabs) {
      if (e.addr >= s.region.base && e.addr < s.region.base + s.region.size) {
        s.alloc.Free(e.addr - s.region.base, e.length);
        break;
      }
    }
  }
}

Result<std::vector<Allocation>> Space::Allocate(const Placement& p) {
  std::lock_guard lock(mu_);
  if (nodes_.size() < p.replicas) {
    return Status::Unavailable(std::to_string(p.replicas) + " replicas need as many nodes; " +
                               std::to_string(nodes_.size()) + " mounted");
  }
  std::vector<std::pair<const std::string*, Node*>> order;
  const auto now = Clock::now();
  for (auto& [name, n] : nodes_) {
    if (n.fenced_until <= now) order.emplace_back(&name, &n);
  }
  if (order.size() < p.replicas) {
    return Status::Unavailable(std::to_string(p.replicas - order.size()) +
                               " of the nodes are fenced after a master change; retry shortly");
  }
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const bool pa = *a.first == p.preferred, pb = *b.first == p.preferred;
    if (pa != pb) return pa;
    return a.second->free_bytes() > b.second->free_bytes();
  });
  std::vector<Allocation> out;
  for (auto& [name, node] : order) {
    if (out.size() == p.replicas) break;
    Allocation a{*name, node->generation, node->epoch, {}};
    if (AllocateOn(*node, p.size, &a.extents)) out.push_back(std::move(a));
  }
  if (out.size() < p.replicas) {
    for (const auto& a : out) FreeOn(nodes_.at(a.node), a.extents);
    return Status::ResourceExhausted("no room for " + std::to_string(p.replicas) + " x " +
                                     std::to_string(p.size) + " bytes");
  }
  return out;
}

void Space::Free(const Allocation& a) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(a.node);
  if (it == nodes_.end() || it->second.generation != a.generation) return;
  FreeOn(it->second, a.extents);
}

bool Space::Claim(const std::string& node, uint64_t generation, const std::vector<Extent>& extents,
                  Allocation* out) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.generation != generation) return false;
  Node& n = it->second;
  std::vector<Extent> taken;
  for (const Extent& e : extents) {
    bool ok = false;
    for (auto& s : n.slabs) {
      const Region& r = s.region;
      if (e.addr >= r.base && e.length <= r.size && e.addr - r.base <= r.size - e.length) {
        ok = s.alloc.Claim(e.addr - r.base, e.length);
        break;
      }
    }
    if (!ok) {
      FreeOn(n, taken);
      return false;
    }
    taken.push_back(e);
  }
  *out = Allocation{node, generation, n.epoch, std::move(taken)};
  return true;
}

void Space::Fence(const std::string& node, uint64_t generation, Clock::time_point until) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end() && it->second.generation == generation) it->second.fenced_until = until;
}

SpaceUsage Space::Usage() const {
  std::lock_guard lock(mu_);
  SpaceUsage u{0, 0, nodes_.size()};
  for (const auto& [name, n] : nodes_) {
    for (const auto& s : n.slabs) {
      u.capacity += s.alloc.size();
      u.used += s.alloc.size() - s.alloc.free_bytes();
    }
  }
  return u;
}

}  // namespace ferry::store
