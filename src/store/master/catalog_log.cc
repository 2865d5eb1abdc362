#include "store/master/catalog_log.h"

#include <algorithm>

namespace ferry::store {

void CatalogLog::Reset(const std::string& node, uint64_t generation) {
  {
    std::lock_guard lock(mu_);
    Node n;
    n.generation = generation;
    nodes_[node] = std::move(n);
  }
  cv_.notify_all();  // a commit waiting on the old mount gives up
}

void CatalogLog::Drop(const std::string& node, uint64_t generation) {
  {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(node);
    if (it != nodes_.end() && it->second.generation == generation) nodes_.erase(it);
  }
  cv_.notify_all();
}

uint64_t CatalogLog::Add(const std::string& node, uint64_t generation, bool forget,
                         CatalogEntry entry) {
  uint64_t seq = 0;
  {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(node);
    if (it == nodes_.end() || it->second.generation != generation) return 0;
    Node& n = it->second;
    seq = n.next++;
    n.pending.push_back({seq, forget, std::move(entry)});
  }
  cv_.notify_all();  // the node's held heartbeat answers
  return seq;
}

std::vector<CatalogChange> CatalogLog::Since(const std::string& node, uint64_t acked, bool fetch,
                                             Millis hold) {
  const auto deadline = Clock::now() + hold;
  std::unique_lock lock(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return {};
  const uint64_t generation = it->second.generation;
  {
    Node& n = it->second;
    // A node cannot have applied what was never sent.
    const uint64_t before = n.acked;
    n.acked = std::max(n.acked, std::min(acked, n.next - 1));
    std::erase_if(n.pending, [&](const CatalogChange& c) { return c.seq <= n.acked; });
    if (n.acked != before) cv_.notify_all();  // commits waiting for it
  }
  if (!fetch) return {};
  // The map may change while waiting: find the mount again each time.
  auto find = [&]() -> Node* {
    auto f = nodes_.find(node);
    return f != nodes_.end() && f->second.generation == generation ? &f->second : nullptr;
  };
  cv_.wait_until(lock, deadline, [&] {
    Node* n = find();
    return closed_ || n == nullptr || !n->pending.empty();
  });
  Node* n = find();
  if (n == nullptr) return {};
  const size_t k = std::min(n->pending.size(), kMaxPerReply);
  return {n->pending.begin(), n->pending.begin() + static_cast<std::ptrdiff_t>(k)};
}

bool CatalogLog::WaitApplied(const std::string& node, uint64_t generation, uint64_t seq,
                             Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  bool applied = false;
  cv_.wait_until(lock, deadline, [&] {
    auto it = nodes_.find(node);
    applied = it == nodes_.end() || it->second.generation != generation || it->second.acked >= seq;
    return applied || closed_;
  });
  return applied;
}

void CatalogLog::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

uint64_t CatalogLog::Pending() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto& [name, node] : nodes_) n += node.pending.size();
  return n;
}

}  // namespace ferry::store
