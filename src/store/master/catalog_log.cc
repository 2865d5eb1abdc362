#include "store/master/catalog_log.h"

#include <algorithm>

namespace ferry::store {

void CatalogLog::Reset(const std::string& node, uint64_t generation) {
  std::lock_guard lock(mu_);
  Node n;
  n.generation = generation;
  nodes_[node] = std::move(n);
}

void CatalogLog::Drop(const std::string& node, uint64_t generation) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end() && it->second.generation == generation) nodes_.erase(it);
}

uint64_t CatalogLog::Add(const std::string& node, uint64_t generation, bool forget,
                         CatalogEntry entry) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.generation != generation) return 0;
  Node& n = it->second;
  const uint64_t seq = n.next++;
  n.pending.push_back({seq, forget, std::move(entry)});
  return seq;
}

std::vector<CatalogChange> CatalogLog::Since(const std::string& node, uint64_t acked,
                                             bool fetch) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return {};
  Node& n = it->second;
  // A node cannot have applied what was never sent.
  n.acked = std::max(n.acked, std::min(acked, n.next - 1));
  std::erase_if(n.pending, [&](const CatalogChange& c) { return c.seq <= n.acked; });
  if (!fetch) return {};
  const size_t k = std::min(n.pending.size(), kMaxPerReply);
  return {n.pending.begin(), n.pending.begin() + static_cast<std::ptrdiff_t>(k)};
}

uint64_t CatalogLog::Pending() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto& [name, node] : nodes_) n += node.pending.size();
  return n;
}

}  // namespace ferry::store
