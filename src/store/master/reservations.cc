// Reservations (PutSpec::reserve): space granted ahead of a put, with no key,
// that its commit names. PutBegin makes them; the tick reclaims the expired
// and DropNode those on a lost node (master.cc, membership.cc).
#include "store/master/master.h"
#include "store/master/master_util.h"

namespace ferry::store {

Status Master::CommitReserved(const std::string& key, uint64_t put_id, bool commit,
                              std::vector<Queued>* queued) {
  // The key is checked first: a malformed one ends nothing.
  if (commit) FERRY_RETURN_IF_ERROR(CheckKey(key));
  Object obj;
  {
    std::lock_guard lock(reserved_mu_);
    auto it = reserved_.find(put_id);
    if (it == reserved_.end()) {
      return Status::NotFound("no reservation " + std::to_string(put_id) +
                              " (expired, ended or node lost)");
    }
    obj = std::move(it->second);
    reserved_.erase(it);
  }
  const auto now = Clock::now();
  Status st = Status::Ok();
  if (!commit) {
    FERRY_COUNT(puts_aborted, 1);
  } else if (now >= obj.put_deadline) {
    st = Status::Timeout("the reservation expired before its commit");
  } else {
    Shard& shard = ShardOf(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.objects.find(key);
    if (it == shard.objects.end()) {
      obj.complete = true;
      obj.last_access = now;
      auto& placed = shard.objects.emplace(key, std::move(obj)).first->second;
      ++objects_;
      Tell(key, placed, /*forget=*/false, queued);
      FERRY_COUNT(puts_committed, 1);
      FERRY_COUNT(reserved_committed, 1);
      return Status::Ok();
    }
    st = it->second.complete ? Status::AlreadyExists("key exists")
                             : Status::Busy("another put of this key is open");
  }
  // Not the object: its space may still be written for a while.
  FreeLater(std::move(obj.replicas), now + options_.write_grace);
  return st;
}

uint64_t Master::DropReservations() {
  std::lock_guard lock(reserved_mu_);
  uint64_t bytes = 0;
  const auto until = Clock::now() + options_.write_grace;  // one may be being written
  for (auto& [id, o] : reserved_) {
    bytes += Bytes(o.replicas);
    FreeLater(std::move(o.replicas), until);
  }
  reserved_.clear();
  return bytes;
}

}  // namespace ferry::store
