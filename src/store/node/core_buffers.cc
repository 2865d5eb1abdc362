// StoreCore's registry of the memory the engine may move straight to and
// from, and which of it is GPU memory (classified once, at Register).
#include "gpu/gpu.h"
#include "store/node/core.h"

namespace ferry::store {

Status StoreCore::Register(void* data, size_t size) {
  FERRY_RETURN_IF_ERROR(engine_.RegisterMemory(data, size));
  // Classified once here, as the engine does, never per request.
  const bool gpu = gpu::Classify(data).kind == gpu::MemoryKind::kDevice;
  std::lock_guard lock(buf_mu_);
  buffers_[reinterpret_cast<uint64_t>(data)] = {size, gpu};
  return Status::Ok();
}

Status StoreCore::Unregister(void* data) {
  FERRY_RETURN_IF_ERROR(engine_.UnregisterMemory(data));
  std::lock_guard lock(buf_mu_);
  buffers_.erase(reinterpret_cast<uint64_t>(data));
  return Status::Ok();
}

const StoreCore::Range* StoreCore::Find(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uint64_t>(p);
  auto it = buffers_.upper_bound(a);
  if (it == buffers_.begin()) return nullptr;
  --it;
  const uint64_t size = it->second.size;
  return a - it->first <= size && n <= size - (a - it->first) ? &it->second : nullptr;
}

bool StoreCore::Registered(std::span<const Part> parts) {
  std::lock_guard lock(buf_mu_);
  for (const Part& p : parts) {
    if (Find(p.data, p.size) == nullptr) return false;
  }
  return true;
}

bool StoreCore::IsGpu(const uint8_t* mine, size_t length) {
  std::lock_guard lock(buf_mu_);
  const Range* r = Find(mine, length);
  // Unregistered memory is classified here: a client's GPU memory that this
  // node imported, say.
  return r != nullptr ? r->gpu : gpu::Classify(mine).kind == gpu::MemoryKind::kDevice;
}

}  // namespace ferry::store
