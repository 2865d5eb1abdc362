#include "transfer/peers.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "common/host.h"
#include "common/log.h"
#include "common/ticker.h"
#include "transfer/transport.h"

namespace ferry {

namespace {
// By registration, not generation: the owner reads its generation before
// its regions, so two descriptors of one generation can differ.
bool SameRegions(const SegmentDescriptor& a, const SegmentDescriptor& b) {
  return std::equal(a.regions.begin(), a.regions.end(), b.regions.begin(), b.regions.end(),
                    [](const RegionDesc& x, const RegionDesc& y) {
                      return x.addr == y.addr && x.serial == y.serial;
                    });
}
}  // namespace

Result<std::shared_ptr<Segment>> PeerTable::Open(std::string_view name) {
  FERRY_ASSIGN_OR_RETURN(SegmentAddress addr, ParseSegmentName(name));
  if (name == cfg_.self_name) return Add(name, addr, cfg_.describe_self());
  FERRY_ASSIGN_OR_RETURN(SegmentDescriptor d, Fetch(std::string(name), addr));
  return Add(name, addr, std::move(d));
}

Result<SegmentDescriptor> PeerTable::Fetch(const std::string& name,
                                           const SegmentAddress& addr) const {
  if (cfg_.fetch) return cfg_.fetch(name);
  return FetchDescriptor(addr, cfg_.connect_timeout, cfg_.key);
}

void PeerTable::Invalidate(std::string_view name) {
  std::lock_guard lk(mu_);
  for (auto& [id, seg] : segments_) {
    if (!seg->is_self() && (name.empty() || seg->name() == name)) seg->MarkStale();
  }
}

std::shared_ptr<Segment> PeerTable::Add(std::string_view name, const SegmentAddress& addr,
                                        SegmentDescriptor desc) {
  const bool self = name == cfg_.self_name;
  auto d = std::make_shared<const SegmentDescriptor>(std::move(desc));
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard lk(mu_);
    seg = std::make_shared<Segment>(next_id_++, std::string(name), addr.host, addr.port, self);
    seg->WatchGeneration(*d, HostIdentity());
    seg->set_descriptor(std::move(d));
    segments_[seg->id()] = seg;
  }
  // The watch idles while it has no peer to follow: wake it to take this one.
  if (seg->Watched() && watch_ != nullptr) watch_->Wake();
  return seg;
}

std::shared_ptr<Segment> PeerTable::Find(SegmentId id) const {
  std::lock_guard lk(mu_);
  auto it = segments_.find(id);
  return it == segments_.end() ? nullptr : it->second;
}

Status PeerTable::Close(SegmentId id) {
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard lk(mu_);
    auto it = segments_.find(id);
    if (it == segments_.end()) {
      return Status::NotFound("unknown segment " + std::to_string(id));
    }
    seg = std::move(it->second);
    segments_.erase(it);
  }
  seg->CloseEndpoints();
  return Status::Ok();
}

void PeerTable::CloseAll() {
  std::unordered_map<SegmentId, std::shared_ptr<Segment>> all;
  {
    std::lock_guard lk(mu_);
    all.swap(segments_);
  }
  for (auto& [id, seg] : all) seg->CloseEndpoints();
}

Result<SegmentInfo> PeerTable::Info(SegmentId id) {
  auto seg = Find(id);
  if (!seg) return Status::NotFound("unknown segment " + std::to_string(id));
  if (seg->TakeStale()) FERRY_RETURN_IF_ERROR(Refresh(*seg));
  auto d = seg->descriptor();
  SegmentInfo info;
  info.name = seg->name();
  info.epoch = d->epoch;
  info.same_host = d->host_id == HostIdentity();
  for (const auto& r : d->regions) info.buffers.push_back({r.addr, r.length, r.allocated});
  return info;
}

Status PeerTable::Refresh(Segment& seg) {
  auto refreshing = seg.LockRefresh();
  std::shared_ptr<const SegmentDescriptor> fresh;
  if (seg.is_self()) {
    fresh = std::make_shared<SegmentDescriptor>(cfg_.describe_self());
  } else {
    auto d = Fetch(seg.name(), {seg.host(), seg.port()});
    if (!d.ok()) {
      seg.MarkStale();  // try again next time
      return d.status();
    }
    fresh = std::make_shared<SegmentDescriptor>(std::move(d).value());
  }
  auto old = seg.descriptor();
  const bool restarted = old && old->epoch != fresh->epoch;
  if (old && !restarted && fresh->generation < old->generation) return Status::Ok();
  const bool changed = old && !restarted && !SameRegions(*old, *fresh);
  if (changed) Follow(seg, *fresh);
  seg.WatchGeneration(*fresh, HostIdentity());
  seg.set_descriptor(fresh);
  // Again, for any endpoint made meanwhile from the old descriptor; a no-op
  // for the others.
  if (changed) Follow(seg, *fresh);
  if (restarted) {
    FERRY_LOG_WARN("segment {} restarted (epoch {:x} -> {:x}); cache refreshed", seg.name(),
                   old->epoch, fresh->epoch);
    seg.CloseEndpoints();
  }
  return Status::Ok();
}

Status PeerTable::RefreshIfChanged(Segment& seg) {
  if (seg.TakeStale()) return Refresh(seg);
  if (!seg.Outdated()) return Status::Ok();
  if (!seg.Watched() || watch_ == nullptr) return Refresh(seg);
  const Deadline deadline = Deadline::After(cfg_.connect_timeout);
  // A round that starts after this one has seen the change: a peer that
  // keeps registering cannot hold the submit past it.
  const uint64_t round = watch_->runs();
  while (seg.Outdated() && watch_->runs() < round + 2) {
    watch_->Wake();
    if (seg.TakeStale()) return Refresh(seg);  // the watch's refetch failed
    if (deadline.Expired()) {
      return Status::Timeout("registration change at " + seg.name() + " not followed in time");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::Ok();
}

void PeerTable::Follow(Segment& seg, const SegmentDescriptor& fresh) {
  for (auto& [t, ep] : seg.Endpoints()) {
    if (!ep->Follow(fresh)) seg.DropEndpoint(t, ep);
  }
}

Millis PeerTable::WatchRound(bool woken) {
  std::vector<std::shared_ptr<Segment>> segs;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, seg] : segments_) {
      if (!seg->is_self()) segs.push_back(seg);
    }
  }
  const bool any = std::any_of(segs.begin(), segs.end(), [](auto& s) { return s->Watched(); });
  std::erase_if(retry_at_, [&](const auto& e) {
    return std::none_of(segs.begin(), segs.end(),
                        [&](const auto& seg) { return seg->id() == e.first; });
  });
  for (auto& seg : segs) {
    if (!seg->Outdated()) continue;
    auto it = retry_at_.find(seg->id());
    if (it != retry_at_.end() && Clock::now() < it->second && !woken) continue;
    if (Refresh(*seg).ok()) {  // a failure also marks it stale, for the next submit
      retry_at_.erase(seg->id());
    } else {
      retry_at_[seg->id()] = Clock::now() + kWatchBackoff;
    }
  }
  return any ? kWatchPeriod : kWatchIdle;
}

}  // namespace ferry
