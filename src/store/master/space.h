// The memory the nodes contribute: each mounted node's regions with one offset
// allocator each, liveness, and placement of replicas on distinct nodes.
// Thread safe. Lock order in the master: a metadata shard, then Space.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "ferry/status.h"
#include "store/master/allocator.h"
#include "store/rpc/limits.h"

namespace ferry::store {

struct Region {
  uint64_t base = 0;  // virtual address in the node's process
  uint64_t size = 0;
};

// Bytes at `addr` in a node's memory.
struct Extent {
  uint64_t addr = 0;
  uint64_t length = 0;
};

// One replica's space. `generation` names the mount it came from, so space of a
// node that died and mounted again is never freed into its new allocators;
// `epoch` is that node process's engine epoch, which its addresses belong to.
struct Allocation {
  std::string node;
  uint64_t generation = 0;
  uint64_t epoch = 0;
  std::vector<Extent> extents;
};

struct Placement {
  uint64_t size = 0;
  uint32_t replicas = 1;
  std::string preferred;  // a node to try first
};

struct SpaceUsage {
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t nodes = 0;
};

class Space {
 public:
  // Largest number of extents one replica may be split into.
  static constexpr size_t kMaxExtents = store::kMaxExtents;
  static constexpr size_t kMaxRegions = store::kMaxRegions;

  // Mounts `node`, the process of engine epoch `epoch`, replacing an earlier
  // mount of the same name, whose generation goes to *replaced (0 if none).
  // InvalidArgument for a zero epoch, empty, overlapping, wrapping or too
  // many regions. Returns the new generation.
  Result<uint64_t> Mount(const std::string& node, uint64_t epoch,
                         const std::vector<Region>& regions, uint64_t* replaced);
  // Records a heartbeat; false when the node is not mounted.
  bool Touch(const std::string& node);
  // Unmounts `node`; its generation, or 0 if it was not mounted.
  uint64_t Unmount(const std::string& node);
  // Unmounts every node silent since before `cutoff`; their (node, generation).
  std::vector<std::pair<std::string, uint64_t>> Expire(Clock::time_point cutoff);

  // `replicas` allocations of `size` bytes on distinct nodes, the preferred node
  // first when it fits, then the nodes with most free space. All or nothing:
  // ResourceExhausted when it does not fit, Unavailable when fewer nodes
  // than replicas are mounted (a node away: a retry may succeed).
  Result<std::vector<Allocation>> Allocate(const Placement& placement);
  // Returns space; ignored when its node's generation is gone.
  void Free(const Allocation& allocation);
  // Takes exactly `extents` on the mount (`node`, `generation`), as a master
  // rebuilt from catalogs does; all or nothing. Fills *out. False when the
  // mount is gone or any byte is outside its regions or already taken.
  bool Claim(const std::string& node, uint64_t generation, const std::vector<Extent>& extents,
             Allocation* out);
  // No new allocation lands on the mount before `until`: its free space may
  // still be written by puts that an earlier master granted.
  void Fence(const std::string& node, uint64_t generation, Clock::time_point until);

  SpaceUsage Usage() const;

 private:
  struct Slab {
    Region region;
    OffsetAllocator alloc;
  };
  struct Node {
    uint64_t generation = 0;
    uint64_t epoch = 0;
    Clock::time_point last_seen;
    Clock::time_point fenced_until;  // no allocation before
    std::vector<Slab> slabs;
    uint64_t free_bytes() const;
  };
  // One allocation of `size` on `node`, split over extents if it must be.
  static bool AllocateOn(Node& node, uint64_t size, std::vector<Extent>* out);
  static void FreeOn(Node& node, const std::vector<Extent>& extents);

  mutable std::mutex mu_;
  std::map<std::string, Node> nodes_;  // guarded by mu_
  uint64_t next_generation_ = 1;       // guarded by mu_
};

}  // namespace ferry::store
