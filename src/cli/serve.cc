#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/cli.h"
#include "common/prefault.h"
#include "ferry/engine.h"
#include "gpu/gpu.h"

namespace ferry::cli {

int Serve(const ServeArgs& args) {
  // Before the engine: same-host peers must then reach it without tracing it.
  if (args.non_dumpable && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    std::fprintf(stderr, "ferry serve: PR_SET_DUMPABLE: %s\n", std::strerror(errno));
    return 1;
  }
  auto engine =
      StartServingEngine("ferry serve", args.host, args.port, args.transport, "", args.metadata);
  if (!engine) return 1;
  Engine& e = *engine;
  nlohmann::json out = {{"segment", e.name()}, {"epoch", e.epoch()}, {"pid", getpid()}};
  void* alloc = nullptr;
  if (args.alloc_bytes > 0) {
    auto p = e.AllocateMemory(args.alloc_bytes);
    if (!p.ok()) {
      std::fprintf(stderr, "ferry serve: %s\n", p.status().ToString().c_str());
      return 1;
    }
    alloc = p.value();
    if (args.prefault) Prefault(alloc, args.alloc_bytes);
    out["alloc"] = {{"addr", reinterpret_cast<uint64_t>(alloc)}, {"length", args.alloc_bytes}};
  }
  void* heap = nullptr;
  if (args.heap_bytes > 0) {
    heap = std::calloc(1, args.heap_bytes);
    Status st = heap ? e.RegisterMemory(heap, args.heap_bytes)
                     : Status::ResourceExhausted("heap allocation failed");
    if (!st.ok()) {
      std::fprintf(stderr, "ferry serve: %s\n", st.ToString().c_str());
      return 1;
    }
    out["heap"] = {{"addr", reinterpret_cast<uint64_t>(heap)}, {"length", args.heap_bytes}};
  }
  void* gpu_mem = nullptr;
  if (args.gpu_bytes > 0) {
    auto g = gpu::AllocDevice(args.gpu_bytes, args.gpu_device);
    Status st = g.ok() ? e.RegisterMemory(g.value(), args.gpu_bytes) : g.status();
    if (!st.ok()) {
      std::fprintf(stderr, "ferry serve: --gpu-alloc: %s\n", st.ToString().c_str());
      return 1;
    }
    gpu_mem = g.value();
    out["gpu"] = {{"addr", reinterpret_cast<uint64_t>(gpu_mem)},
                  {"length", args.gpu_bytes},
                  {"device", args.gpu_device}};
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  // SIGUSR1 registers a new --gpu-alloc buffer, then unregisters the old one,
  // and prints the new one as a JSON line: a peer whose registrations change
  // after segments were opened, for tests. Replaced buffers stay allocated
  // until exit, as imports of them may still be open elsewhere. Without a
  // GPU buffer it swaps the --alloc one the same way, freeing the old one
  // (peers' mappings keep its memfd's pages).
  std::vector<void*> retired;
  while (WaitForStopSignal(true) == SIGUSR1) {
    nlohmann::json swapped;
    if (gpu_mem == nullptr && alloc != nullptr) {
      auto p = e.AllocateMemory(args.alloc_bytes);
      Status st = p.ok() ? e.FreeMemory(alloc) : p.status();
      if (st.ok()) {
        alloc = p.value();
        swapped["alloc"] = {{"addr", reinterpret_cast<uint64_t>(alloc)},
                            {"length", args.alloc_bytes}};
      } else {
        swapped["error"] = st.ToString();
      }
    } else if (gpu_mem == nullptr) {
      swapped["error"] = "no --gpu-alloc or --alloc buffer to swap";
    } else {
      auto g = gpu::AllocDevice(args.gpu_bytes, args.gpu_device);
      Status st = g.ok() ? e.RegisterMemory(g.value(), args.gpu_bytes) : g.status();
      if (st.ok()) st = e.UnregisterMemory(gpu_mem);
      if (st.ok()) {
        retired.push_back(gpu_mem);
        gpu_mem = g.value();
        swapped["gpu"] = {{"addr", reinterpret_cast<uint64_t>(gpu_mem)},
                          {"length", args.gpu_bytes},
                          {"device", args.gpu_device}};
      } else {
        if (g.ok()) {
          (void)e.UnregisterMemory(g.value());  // NotFound if it never got that far
          gpu::FreeDevice(g.value());
        }
        swapped["error"] = st.ToString();
      }
    }
    std::printf("%s\n", swapped.dump().c_str());
    std::fflush(stdout);
  }
  engine.reset();
  std::free(heap);
  if (gpu_mem != nullptr) gpu::FreeDevice(gpu_mem);
  for (void* p : retired) gpu::FreeDevice(p);
  return 0;
}

}  // namespace ferry::cli
