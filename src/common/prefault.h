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

}  // namespace ferry
