// Routing and validation, shared by both submit paths: the whole-batch
// checks, where each side of a request is (host or which GPU), whether the
// remote range is registered at the target, and which transport serves it.
#pragma once

#include <memory>
#include <set>
#include <span>
#include <unordered_map>

#include "ferry/types.h"
#include "transfer/registry.h"

namespace ferry {

class MemoryRegistry;
class PeerTable;
class Segment;

class Router {
 public:
  // `gpu`: there is a GPU, so requests may hold GPU memory.
  Router(const TransportSet& transports, PeerTable& peers, const MemoryRegistry& registry, bool gpu)
      : transports_(transports), peers_(peers), registry_(registry), gpu_(gpu) {}

  using Segments = std::unordered_map<SegmentId, std::shared_ptr<Segment>>;
  // InvalidArgument (empty batch, null local, zero length, unknown op) or
  // NotFound (unknown segment) for the whole batch; fills `segs` otherwise.
  Status Validate(std::span<const Request> reqs, Segments* segs) const;

  // R7: a remote range must lie inside one registered buffer of the target,
  // as its descriptor says, before any byte moves; a transport that slices a
  // request would otherwise apply the slices that fit. A peer may have
  // registered memory since the descriptor was fetched, so a miss refetches
  // it once per submit (`refreshed` remembers), unless the watch follows the
  // peer. Returns where the buffer is: its GPU, or -1 for host memory;
  // OutOfRange when it is not registered.
  //
  // A batch's requests mostly lie in one registered buffer a side, and each
  // lookup takes a lock, and for this process's buffers copies the region
  // (with the rest of a submit's loop, about 0.3 µs a request on the H200
  // machine). `memo` (null: none), one per submit, keeps the buffers last
  // found at each end; CheckRemote and GpuSides answer from it when the
  // range lies inside. A refetch forgets the remote one.
  struct Memo {
    const Segment* seg = nullptr;  // the remote buffer's segment
    uint64_t remote_lo = 0, remote_hi = 0;
    int remote_where = -1;
    uint64_t local_lo = 0, local_hi = 0;  // a registered local buffer
    int local_device = -1;
  };
  Result<int> CheckRemote(const Request& r, Segment& seg, std::set<SegmentId>* refreshed,
                          Memo* memo = nullptr) const;

  // Where a request's GPU memory is: each side's device, -1 for host memory.
  struct Sides {
    int local = -1;
    int remote = -1;
    // The GPU that copies: the local one, else the remote one.
    int device() const { return local >= 0 ? local : remote; }
  };
  // The remote side is CheckRemote's answer; the local side was classified
  // at registration, or is classified here for other buffers. All host
  // without a GPU.
  Sides GpuSides(const Request& r, int remote_device, Memo* memo = nullptr) const;

  // TransportSet::RouteTo.
  Result<TransportSet::Route> Route(const std::shared_ptr<Segment>& seg, bool gpu) const {
    return transports_.RouteTo(seg, gpu);
  }
  // Sets up the paths to a newly opened peer: the host path's endpoint,
  // warmed (Endpoint::Warm: shm maps the peer's buffers), and the GPU path
  // (IPC imports, registered mappings), so no data path opens or registers
  // anything (R4).
  void Prepare(const std::shared_ptr<Segment>& seg) const;

  // Whether the segment's memory is this process's: our own segment, or
  // another engine's in this process.
  static bool InThisProcess(const Segment& seg);

  const TransportSet& transports() const { return transports_; }
  bool gpu() const { return gpu_; }

 private:
  const TransportSet& transports_;
  PeerTable& peers_;
  const MemoryRegistry& registry_;
  const bool gpu_;
};

}  // namespace ferry
