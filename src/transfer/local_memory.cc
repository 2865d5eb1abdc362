#include "transfer/local_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/prefault.h"
#include "transfer/descriptor.h"

namespace ferry {

Result<std::unique_ptr<LocalMemory>> LocalMemory::Create(bool gpu, bool populate) {
  std::unique_ptr<LocalMemory> m(new LocalMemory(gpu, populate));
  FERRY_RETURN_IF_ERROR(m->MakeGenerationPage());
  return m;
}

LocalMemory::~LocalMemory() {
  for (const Region& r : registry_.Snapshot()) {
    if (r.owned) ReleaseOwned(r);
  }
  if (generation_ != nullptr) munmap(generation_, kGenerationPageBytes);
  if (generation_fd_ >= 0) close(generation_fd_);
}

// The registration generation lives in a page of its own memfd, which
// same-host peers map: every registration and removal bumps it, and their
// next submit sees the change with one load and refetches the descriptor.
Status LocalMemory::MakeGenerationPage() {
  generation_fd_ = memfd_create("ferry-generation", MFD_CLOEXEC);
  if (generation_fd_ < 0) return Status::FromErrno(errno, "memfd_create");
  if (ftruncate(generation_fd_, static_cast<off_t>(kGenerationPageBytes)) != 0)
    return Status::FromErrno(errno, "ftruncate");
  void* p =
      mmap(nullptr, kGenerationPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, generation_fd_, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap");
  generation_ = static_cast<uint64_t*>(p);
  registry_.set_control_memfd(generation_fd_);
  return Status::Ok();
}

Status LocalMemory::Add(Region r, const gpu::MemoryInfo& info) {
  r.serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
  if (describe_) r.blobs = describe_(r, info);
  FERRY_RETURN_IF_ERROR(registry_.Add(r));
  BumpGeneration();
  return Status::Ok();
}

Status LocalMemory::Register(void* addr, size_t length) {
  Region r;
  r.addr = reinterpret_cast<uint64_t>(addr);
  r.length = length;
  gpu::MemoryInfo info;
  if (gpu_) {
    info = gpu::Classify(addr);
    r.kind = info.kind;
    r.device = info.device;
  }
  if (populate_ && r.kind != gpu::MemoryKind::kDevice) Populate(addr, length);
  return Add(std::move(r), info);
}

// A first transfer into memory nobody has written faults once per page, in
// the receiving thread (tcp) or a peer's copy: that cost is paid here, at
// registration. Not for more than half the machine's memory, which a
// reservation larger than what is used (MAP_NORESERVE) could otherwise
// commit whole.
void LocalMemory::Populate(void* addr, size_t length) {
  const auto phys =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (length > phys / 2) {
    FERRY_LOG_INFO("registered {} bytes at {} left unpopulated: more than half of memory", length,
                   addr);
    return;
  }
  if (!PopulateWritable(addr, length)) {
    FERRY_LOG_DEBUG("registered memory at {} not populated: {}", addr, std::strerror(errno));
  }
}

Status LocalMemory::Unregister(void* addr) {
  auto r = registry_.Remove(reinterpret_cast<uint64_t>(addr), false);
  if (!r.ok()) return r.status();
  BumpGeneration();
  return Status::Ok();
}

Result<void*> LocalMemory::Allocate(size_t length) {
  if (length == 0) return Status::InvalidArgument("allocation of zero bytes");
  int fd = memfd_create("ferry-segment", MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
    int err = errno;
    close(fd);
    return Status::FromErrno(err, "ftruncate");
  }
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    return Status::FromErrno(err, "mmap");
  }
  // Populated now, at set-up, so that no transfer into it faults per page;
  // in huge pages where the kernel grants them, so peers' mappings of it
  // cost fewer table entries too.
  AdviseHugePages(p, length);
  if (!PopulateWritable(p, length)) Prefault(p, length);
  Region r;
  r.addr = reinterpret_cast<uint64_t>(p);
  r.length = length;
  r.memfd = fd;
  r.owned = true;
  if (gpu_ && gpu::PinHost(p, length)) {
    r.pinned = true;
    r.kind = gpu::MemoryKind::kHostPinned;
  }
  gpu::MemoryInfo info;
  info.kind = r.kind;
  Status st = Add(r, info);
  if (!st.ok()) {
    ReleaseOwned(r);
    return st;
  }
  return p;
}

Status LocalMemory::Free(void* addr) {
  auto r = registry_.Remove(reinterpret_cast<uint64_t>(addr), true);
  if (!r.ok()) return r.status();
  BumpGeneration();
  ReleaseOwned(r.value());
  return Status::Ok();
}

void LocalMemory::ReleaseOwned(const Region& r) {
  if (r.pinned) gpu::UnpinHost(reinterpret_cast<void*>(r.addr));
  munmap(reinterpret_cast<void*>(r.addr), r.length);
  close(r.memfd);
}

}  // namespace ferry
