// The segments an engine has opened, their cached descriptors, and the watch
// that follows same-host peers' registration changes off the data path.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"
#include "ferry/types.h"
#include "transfer/descriptor.h"
#include "transfer/metadata.h"
#include "transfer/segment.h"

namespace ferry {

class Ticker;

class PeerTable {
 public:
  struct Config {
    std::string self_name;  // this engine's segment name
    Millis connect_timeout{5000};
    // This engine's own descriptor, as peers would fetch it.
    std::function<SegmentDescriptor()> describe_self;
    // The cluster secret, proven to peers before each fetch; null: none.
    std::shared_ptr<const auth::Key> key = nullptr;
    // Where a peer's descriptor comes from (etcd metadata); null: from the
    // peer's listener (p2p, FetchDescriptor).
    std::function<Result<SegmentDescriptor>(const std::string& name)> fetch = nullptr;
  };
  // How often the watch looks: while it follows a peer, when a peer it
  // could not refetch is tried again, and while it follows none.
  static constexpr Millis kWatchPeriod{2};
  static constexpr Millis kWatchBackoff{1000};
  static constexpr Millis kWatchIdle{1000};

  // `watch` runs WatchRound and is woken by the table when it has a new
  // peer to follow or a submit waits for it; null: no watch (nothing waits).
  PeerTable(Config config, Ticker* watch) : cfg_(std::move(config)), watch_(watch) {}
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // Engine::OpenSegment: resolves `name`, fetching the descriptor unless it
  // is our own, and adds the segment.
  Result<std::shared_ptr<Segment>> Open(std::string_view name);
  // Adds a segment whose descriptor is already in hand; wakes the watch when
  // it can follow it, so an idle watch takes it at once.
  std::shared_ptr<Segment> Add(std::string_view name, const SegmentAddress& addr,
                               SegmentDescriptor desc);
  // Null when `id` is not open.
  std::shared_ptr<Segment> Find(SegmentId id) const;
  // The descriptor of every open segment named `name` (every segment, when
  // empty) is refetched before its next use: its metadata entry changed.
  void Invalidate(std::string_view name);
  // Engine::CloseSegment: NotFound, or the segment is forgotten and its
  // endpoints closed (their held tasks fail with Cancelled).
  Status Close(SegmentId id);
  // Closes every segment; at engine teardown.
  void CloseAll();
  // Engine::GetSegmentInfo.
  Result<SegmentInfo> Info(SegmentId id);

  // Refetches the descriptor. On an epoch change the endpoints are dropped,
  // so mappings and connections of the old process are never reused. On a
  // registration change they follow it before requests see it. One at a
  // time per segment, and never backwards: a fetch older than what is held
  // is ignored. A failed fetch marks the segment stale.
  Status Refresh(Segment& seg);
  // The data path's refresh, before a submit. A same-host peer the watch
  // follows changes registrations through the watch alone, since following
  // may import and page-lock (R4): the submit wakes it and waits, up to
  // connect_timeout (then Timeout). A peer that restarted, or that the watch
  // could not refetch, is refetched here.
  Status RefreshIfChanged(Segment& seg);

  // One round of the watch: refreshes the outdated peers it follows, a peer
  // that failed again only after kWatchBackoff unless `woken`. Returns the
  // period until the next round: kWatchPeriod while it follows a peer,
  // kWatchIdle while it follows none, so an idle engine stays asleep.
  Millis WatchRound(bool woken);

 private:
  // Endpoints that cannot follow a registration change are dropped; work in
  // flight keeps them, and their mappings, until done.
  static void Follow(Segment& seg, const SegmentDescriptor& fresh);
  Result<SegmentDescriptor> Fetch(const std::string& name, const SegmentAddress& addr) const;

  const Config cfg_;
  Ticker* const watch_;
  mutable std::mutex mu_;
  std::unordered_map<SegmentId, std::shared_ptr<Segment>> segments_;  // guarded by mu_
  SegmentId next_id_ = 1;                                             // guarded by mu_
  std::unordered_map<SegmentId, Clock::time_point> retry_at_;         // WatchRound's own
};

}  // namespace ferry
