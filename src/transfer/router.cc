#include "transfer/router.h"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "common/host.h"
#include "common/log.h"
#include "gpu/gpu.h"
#include "transfer/memory_registry.h"
#include "transfer/peers.h"
#include "transfer/segment.h"

namespace ferry {

Status Router::Validate(std::span<const Request> reqs, Segments* segs) const {
  if (reqs.empty()) return Status::InvalidArgument("empty batch");
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& r = reqs[i];
    auto bad = [i](StatusCode code, const std::string& why) {
      return Status(code, "request " + std::to_string(i) + ": " + why);
    };
    if (r.local == nullptr) return bad(StatusCode::kInvalidArgument, "null local address");
    if (r.length == 0) return bad(StatusCode::kInvalidArgument, "zero length");
    if (r.op != Op::kRead && r.op != Op::kWrite) {
      return bad(StatusCode::kInvalidArgument, "unknown op");
    }
    if (!segs->count(r.segment)) {
      auto seg = peers_.Find(r.segment);
      if (!seg) {
        return bad(StatusCode::kNotFound, "unknown segment " + std::to_string(r.segment));
      }
      segs->emplace(r.segment, std::move(seg));
    }
  }
  return Status::Ok();
}

namespace {
// Whether [addr, addr+length) lies inside [lo, hi).
bool Inside(uint64_t addr, uint64_t length, uint64_t lo, uint64_t hi) {
  return addr >= lo && addr < hi && length <= hi - addr;
}
}  // namespace

Result<int> Router::CheckRemote(const Request& r, Segment& seg, std::set<SegmentId>* refreshed,
                                Memo* memo) const {
  if (memo != nullptr && memo->seg == &seg &&
      Inside(r.remote, r.length, memo->remote_lo, memo->remote_hi)) {
    return memo->remote_where;
  }
  auto find = [&]() -> std::optional<int> {
    uint64_t lo = 0, hi = 0;
    int where = -1;
    if (seg.is_self()) {
      auto reg = registry_.Find(r.remote, r.length);
      if (!reg) return std::nullopt;
      lo = reg->addr;
      hi = reg->addr + reg->length;
      if (reg->kind == gpu::MemoryKind::kDevice) where = std::max(reg->device, 0);
    } else {
      auto d = seg.descriptor();
      const RegionDesc* g = d ? d->Find(r.remote, r.length) : nullptr;
      if (g == nullptr) return std::nullopt;
      lo = g->addr;
      hi = g->addr + g->length;
      // The peer's device index, where this process sees that many GPUs.
      if (g->kind == static_cast<uint8_t>(gpu::MemoryKind::kDevice)) {
        where = g->device >= 0 && g->device < gpu::DeviceCount() ? g->device : 0;
      }
    }
    if (memo != nullptr) {
      memo->seg = &seg;
      memo->remote_lo = lo;
      memo->remote_hi = hi;
      memo->remote_where = where;
    }
    return where;
  };
  if (auto where = find()) return *where;
  // A peer the watch follows has no registration the page has not shown.
  if (!seg.is_self() && !seg.Watched() && refreshed->insert(seg.id()).second) {
    // What the old descriptor showed may be gone from the new one.
    if (memo != nullptr && memo->seg == &seg) memo->seg = nullptr;
    FERRY_RETURN_IF_ERROR(peers_.Refresh(seg));
    if (auto where = find()) return *where;
  }
  return Status::OutOfRange(fmt::format("0x{:x}+{} is not inside one registered buffer of {}",
                                        r.remote, r.length, seg.name()));
}

Router::Sides Router::GpuSides(const Request& r, int remote_device, Memo* memo) const {
  Sides sides;
  if (!gpu_) return sides;
  sides.remote = remote_device;
  const auto addr = reinterpret_cast<uint64_t>(r.local);
  if (memo != nullptr && Inside(addr, r.length, memo->local_lo, memo->local_hi)) {
    sides.local = memo->local_device;
    return sides;
  }
  if (auto reg = registry_.Find(addr, r.length)) {
    if (reg->kind == gpu::MemoryKind::kDevice) sides.local = std::max(reg->device, 0);
    if (memo != nullptr) {
      memo->local_lo = reg->addr;
      memo->local_hi = reg->addr + reg->length;
      memo->local_device = sides.local;
    }
    return sides;
  }
  const gpu::MemoryInfo local = gpu::Classify(r.local);
  if (local.kind == gpu::MemoryKind::kDevice) sides.local = std::max(local.device, 0);
  return sides;
}

void Router::Prepare(const std::shared_ptr<Segment>& seg) const {
  auto d = seg->descriptor();
  if (!d || seg->is_self()) return;
  if (auto host = Route(seg, false); host.ok()) host.value().endpoint->Warm();
  if (!gpu_) return;
  auto r = Route(seg, true);
  if (!r.ok()) FERRY_LOG_DEBUG("no GPU path to {}: {}", seg->name(), r.status().ToString());
}

bool Router::InThisProcess(const Segment& seg) {
  if (seg.is_self()) return true;
  auto d = seg.descriptor();
  return d && d->pid == static_cast<uint32_t>(getpid()) && d->host_id == HostIdentity();
}

}  // namespace ferry
