// Space reserved at the master ahead of puts (PutSpec::reserve), so that a
// put of a shape seen before skips PutBegin's round trip: it writes into a
// reservation, and its commit names the object. A background thread keeps,
// for each shape (size, replicas) that recent puts used more than once, as
// many reservations as the last put of it took, within `max_bytes` in all. Reservations are used
// only while at least half their timeout is left, and the thread ends older ones, so a put never
// starts writing into space that may be reclaimed under it. Thread safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "store/rpc/master_client.h"

namespace ferry::store {

class ReservePool {
 public:
  struct Reservation {
    uint64_t put_id = 0;
    std::vector<StoreReplica> replicas;
    Clock::time_point deadline;  // the master reclaims it then
    Millis timeout{0};
  };

  // `client` outlives the pool. `client_node`, `prefer_local`: as for PutBegin.
  ReservePool(MasterClient& client, std::string client_node, bool prefer_local, uint64_t max_bytes);
  // Ends the reservations it holds (best effort: the master reclaims them anyway).
  ~ReservePool();
  ReservePool(const ReservePool&) = delete;
  ReservePool& operator=(const ReservePool&) = delete;

  // One reservation of that shape with half its timeout left, or nullopt.
  std::optional<Reservation> Take(uint64_t size, uint32_t replicas);
  // A put took (or would have taken) `count` of that shape: from its second
  // put within 10 s on, the pool holds that many, refilled at once.
  void Want(uint64_t size, uint32_t replicas, size_t count);
  // Ends every reservation held: after a master change they are void.
  void Drop();

 private:
  using Shape = std::pair<uint64_t, uint32_t>;  // size, replicas
  struct Held {
    std::vector<Reservation> ready;
    size_t want = 0;
    Clock::time_point wanted;       // last Want
    Clock::time_point retry_after;  // after a refused refill
  };

  static bool Fresh(const Reservation& r, Clock::time_point now) {
    return r.deadline - now >= r.timeout / 2;
  }
  void Loop();
  // Ends `put_ids` at the master, uncommitted.
  void End(const std::vector<uint64_t>& put_ids);

  MasterClient& client_;
  const std::string client_node_;
  const bool prefer_local_;
  const uint64_t max_bytes_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Shape, Held> held_;    // guarded by mu_
  uint64_t held_bytes_ = 0;       // guarded by mu_: ready reservations' bytes, all replicas
  std::vector<uint64_t> ending_;  // guarded by mu_: dropped, for the thread to end
  bool kick_ = false;             // guarded by mu_: work for the thread
  bool stop_ = false;             // guarded by mu_
  std::thread thread_;
};

}  // namespace ferry::store
