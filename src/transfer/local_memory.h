// This engine's own memory: what is registered, what the engine allocated,
// and the generation page that tells same-host peers the registrations
// changed. Memory is classified (host or GPU) once, here, at registration.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "gpu/gpu.h"
#include "transfer/memory_registry.h"

namespace ferry {

class LocalMemory {
 public:
  // Fills a new region's blobs, one per offered transport (TransportSet).
  using Describer = std::function<std::vector<std::string>(const Region&, const gpu::MemoryInfo&)>;

  // `gpu`: there is a GPU, so memory is classified and engine memory
  // page-locked. `populate`: registered host memory is made present and
  // writable at Register (EngineOptions::populate_registered). IoError when
  // the generation page cannot be made.
  static Result<std::unique_ptr<LocalMemory>> Create(bool gpu, bool populate);
  // Unmaps and closes what the engine allocated, and the generation page.
  ~LocalMemory();
  LocalMemory(const LocalMemory&) = delete;
  LocalMemory& operator=(const LocalMemory&) = delete;

  // Set once, before the first registration.
  void set_describer(Describer d) { describe_ = std::move(d); }

  // As Engine::RegisterMemory, UnregisterMemory, AllocateMemory, FreeMemory.
  Status Register(void* addr, size_t length);
  Status Unregister(void* addr);
  Result<void*> Allocate(size_t length);
  Status Free(void* addr);

  const MemoryRegistry& registry() const { return registry_; }
  // The registration generation, bumped by every change; read it before
  // taking a snapshot of the regions (a change in between costs peers only a
  // refresh). The page's memfd, for peers to map.
  uint64_t generation() const { return __atomic_load_n(generation_, __ATOMIC_ACQUIRE); }
  int generation_fd() const { return generation_fd_; }

 private:
  LocalMemory(bool gpu, bool populate) : gpu_(gpu), populate_(populate) {}
  Status MakeGenerationPage();
  void BumpGeneration() { __atomic_add_fetch(generation_, 1, __ATOMIC_RELEASE); }
  Status Add(Region r, const gpu::MemoryInfo& info);
  static void Populate(void* addr, size_t length);
  static void ReleaseOwned(const Region& r);

  const bool gpu_;
  const bool populate_;
  Describer describe_;
  MemoryRegistry registry_;
  int generation_fd_ = -1;
  uint64_t* generation_ = nullptr;        // the page's first word
  std::atomic<uint64_t> next_serial_{1};  // RegionDesc::serial
};

}  // namespace ferry
