#include "gpu/gpu.h"

namespace ferry::gpu {

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHostPageable: return "host-pageable";
    case MemoryKind::kHostPinned: return "host-pinned";
    case MemoryKind::kDevice: return "device";
  }
  return "unknown";
}

}  // namespace ferry::gpu
