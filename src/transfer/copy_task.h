// Helpers shared by the transports that move a task with a CPU copy (shm, local).
#pragma once

#include <cstring>

#include "transfer/batch.h"

namespace ferry {

// OK when the task may start: its endpoint is open, its batch not freed and its
// deadline not passed. Checked at the last moment, on the copy thread.
inline Status CheckRunnable(const Task& t, bool endpoint_closed) {
  if (endpoint_closed) return Status::Cancelled("segment closed");
  if (t.batch->cancelled()) return Status::Cancelled("batch freed");
  if (t.deadline.Expired()) return Status::Timeout("deadline passed before copy");
  return Status::Ok();
}

// Copies in the task's direction between its local buffer and `remote`, the
// remote range as mapped in this process. memmove: a loopback copy may overlap.
inline void CopyTask(const Task& t, char* remote) {
  if (t.op == Op::kWrite) {
    std::memmove(remote, t.local, t.length);
  } else {
    std::memmove(t.local, remote, t.length);
  }
}

}  // namespace ferry
