// The engine's transports: every registered one, made at engine start and
// kept in priority order. Forcing, offering, the registration hooks and the
// choice of a transport per request are decided here, from each transport's
// caps alone (transport.h); nothing here or above names a transport.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "transfer/transport.h"

namespace ferry {

class TransportSet {
 public:
  // Makes every registered transport. `forced` is empty, or the name of a
  // transport that moves host memory between processes; it then serves every
  // host-memory request, to our own segment too. InvalidArgument otherwise,
  // naming the choices, or when a transport refuses its options.
  static Result<std::unique_ptr<TransportSet>> Create(EngineContext& ctx, std::string forced);
  TransportSet(const TransportSet&) = delete;
  TransportSet& operator=(const TransportSet&) = delete;

  // Offers what the descriptor will list (Transport::Offer). Call once,
  // before the first descriptor is served.
  Status OfferAll();

  // The registered names of the transports this engine offers its peers, in
  // the order its descriptor lists them and its regions' blobs go. A forced
  // transport that reaches any host is offered alone, so peers come the
  // same way; one that does not leaves the others offered.
  const std::vector<std::string>& offered() const { return offered_names_; }
  // Each offered transport's blob for this engine, in offered() order.
  std::vector<std::string> DescribeSegment() const;
  // Each offered transport's blob for a new registration, in offered() order.
  std::vector<std::string> DescribeMemory(const Region& region, const gpu::MemoryInfo& info) const;

  // The first transport, in priority order, that may move host memory (or
  // GPU memory, with `gpu`) to `segment`, and its endpoint, made on first
  // use. Never blocks. Unavailable when none reaches it, NotSupported when
  // none moves GPU memory to it.
  struct Route {
    Transport* transport = nullptr;
    std::shared_ptr<Endpoint> endpoint;
  };
  Result<Route> RouteTo(const std::shared_ptr<Segment>& segment, bool gpu) const;

  // The transport that reaches this process's own memory, whatever the
  // engine: what a copy made straight through this address space reports.
  // Null when none is registered.
  const Transport* in_process() const { return in_process_; }
  // Transport::Stop on each, once the engine's io threads have ended.
  void StopAll();
  // Transport::ConfineHelpers on each.
  Status ConfineHelpers(const std::vector<int>& cpus);
  // io_context threads for the engine: the most any transport asks, 1 at least.
  int io_threads() const;
  // Every transport's target side, for the listener.
  std::vector<FrameService*> frame_services() const;

 private:
  TransportSet() = default;
  bool Allowed(const Transport& t) const;

  std::vector<std::unique_ptr<Transport>> all_;  // by priority
  std::vector<Transport*> offered_;              // by priority
  std::vector<std::string> offered_names_;
  const Transport* forced_ = nullptr;
  const Transport* in_process_ = nullptr;
};

}  // namespace ferry
