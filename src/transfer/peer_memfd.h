// Maps a same-host peer's memfd buffer into this process, for the transports
// that copy into it directly (shm, cuda_ipc).
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry {

// Opens /proc/<pid>/fd/<memfd> and maps `length` bytes shared, read-write.
// IoError when the peer's fd cannot be opened, is too small, or cannot be
// mapped. Unmap with munmap(base, length).
Result<char*> MapPeerMemfd(uint32_t pid, int32_t memfd, uint64_t length);

}  // namespace ferry
