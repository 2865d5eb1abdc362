// Faulting memory in before it is used, so the first transfer into it does not
// pay for page faults.
#pragma once

#include <cstddef>

namespace ferry {

// Touches every page of [p, p+n) by reading /dev/zero into it (zeroing it),
// which faults the pages in for the kernel's own accesses too: on VMs with
// shadow page tables the kernel's copy into user memory (a TCP receive) faults
// again on pages only user code has touched. Falls back to memset.
void Prefault(void* p, size_t n);

// Makes every page of [p, p+n) present and writable without changing a byte
// (MADV_POPULATE_WRITE, Linux 5.14): the pages a range partly covers are
// included. False where the kernel cannot, such as older kernels, read-only
// mappings and device memory; nothing is changed then.
bool PopulateWritable(void* p, size_t n);

// Asks for transparent huge pages over [p, p+n) (MADV_HUGEPAGE), so a
// mapping costs a fault or a table entry per 2 MiB rather than per 4 KiB.
// Only a hint: for shared memory the kernel grants it where
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows.
void AdviseHugePages(void* p, size_t n);

}  // namespace ferry
