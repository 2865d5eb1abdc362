#include "store/node/reserve_pool.h"

#include "common/log.h"
#include "common/thread_name.h"

namespace ferry::store {
namespace {

// A shape no put has asked for this long is let go.
constexpr Millis kIdle{10'000};
// After a refused refill (no free space, say), a shape waits this long.
constexpr Millis kBackoff{1'000};
// How often held reservations are checked for age.
constexpr Millis kTick{200};
// At most this many reservations per refill call.
constexpr size_t kMaxAsk = 256;

uint64_t Bytes(uint64_t size, uint32_t replicas) { return size * replicas; }

}  // namespace

ReservePool::ReservePool(MasterClient& client, std::string client_node, bool prefer_local,
                         uint64_t max_bytes)
    : client_(client),
      client_node_(std::move(client_node)),
      prefer_local_(prefer_local),
      max_bytes_(max_bytes) {
  thread_ = std::thread([this] {
    NameThisThread("ferry-reserve");
    Loop();
  });
}

ReservePool::~ReservePool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::vector<uint64_t> ids = std::move(ending_);
  for (auto& [shape, h] : held_) {
    for (const Reservation& r : h.ready) ids.push_back(r.put_id);
  }
  End(ids);
}

std::optional<ReservePool::Reservation> ReservePool::Take(uint64_t size, uint32_t replicas) {
  std::lock_guard lock(mu_);
  auto it = held_.find({size, replicas});
  if (it == held_.end()) return std::nullopt;
  auto& ready = it->second.ready;
  const auto now = Clock::now();
  // Oldest first, so fewer grow stale; a stale one is left to the thread.
  for (auto r = ready.begin(); r != ready.end(); ++r) {
    if (!Fresh(*r, now)) continue;
    Reservation out = std::move(*r);
    ready.erase(r);
    held_bytes_ -= Bytes(size, replicas);
    return out;
  }
  return std::nullopt;
}

void ReservePool::Want(uint64_t size, uint32_t replicas, size_t count) {
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    auto [it, added] = held_.try_emplace({size, replicas});
    Held& h = it->second;
    const bool again = !added && now - h.wanted <= kIdle;
    h.wanted = now;
    // A size seen once may never come back (values of varied sizes): only a
    // shape that repeats is worth holding space for.
    if (!again) return;
    h.want = count;
    kick_ = true;
  }
  cv_.notify_one();
}

void ReservePool::Drop() {
  {
    std::lock_guard lock(mu_);
    for (auto& [shape, h] : held_) {
      for (const Reservation& r : h.ready) ending_.push_back(r.put_id);
      h.ready.clear();
    }
    held_bytes_ = 0;
    kick_ = true;
  }
  cv_.notify_one();
}

void ReservePool::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait_for(lock, kTick, [this] { return stop_ || kick_; });
    if (stop_) return;
    kick_ = false;
    const auto now = Clock::now();
    std::vector<uint64_t> ending = std::move(ending_);
    ending_.clear();
    std::vector<PutSpec> ask;
    std::vector<Shape> asked;
    uint64_t asking = 0;  // bytes
    for (auto it = held_.begin(); it != held_.end();) {
      const Shape shape = it->first;
      Held& h = it->second;
      const uint64_t bytes = Bytes(shape.first, shape.second);
      std::erase_if(h.ready, [&](const Reservation& r) {
        if (Fresh(r, now)) return false;
        ending.push_back(r.put_id);
        held_bytes_ -= bytes;
        return true;
      });
      const bool idle = now - h.wanted > kIdle;
      if (idle) h.want = 0;
      if (idle && h.ready.empty()) {
        it = held_.erase(it);
        continue;
      }
      for (size_t n = h.ready.size(); n < h.want && now >= h.retry_after && ask.size() < kMaxAsk &&
                                      held_bytes_ + asking + bytes <= max_bytes_;
           ++n) {
        asking += bytes;
        PutSpec s;
        s.size = shape.first;
        s.replicas = shape.second;
        s.reserve = true;
        ask.push_back(std::move(s));
        asked.push_back(shape);
      }
      ++it;
    }
    lock.unlock();
    End(ending);
    if (!ask.empty()) {
      const auto sent = Clock::now();
      auto got = client_.PutBegin(ask, client_node_, prefer_local_);
      lock.lock();
      for (size_t k = 0; k < ask.size(); ++k) {
        Held& h = held_[asked[k]];
        if (!got.ok() || !got.value()[k].ok()) {
          h.retry_after = Clock::now() + kBackoff;
          continue;
        }
        PutGrant& g = got.value()[k].value();
        h.ready.push_back({g.put_id, std::move(g.replicas), sent + g.timeout, g.timeout});
        held_bytes_ += Bytes(asked[k].first, asked[k].second);
      }
      if (!got.ok()) FERRY_LOG_DEBUG("store: reserving space: {}", got.status().ToString());
      continue;
    }
    lock.lock();
  }
}

void ReservePool::End(const std::vector<uint64_t>& put_ids) {
  if (put_ids.empty()) return;
  std::vector<PutEnd> ends;
  ends.reserve(put_ids.size());
  for (uint64_t id : put_ids) ends.push_back({"", id, /*commit=*/false, /*reserved=*/true});
  auto r = client_.PutEnd(ends);
  if (!r.ok())
    FERRY_LOG_DEBUG("store: ending {} reservations: {}", ends.size(), r.status().ToString());
}

}  // namespace ferry::store
