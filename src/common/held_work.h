// Work a thread holds back to run later on that same thread. A socket
// thread that has just received into staging holds that staging's landing
// until later receives have pushed its lines out of the core's private
// caches, which the DMA then reads cheaply without the write-back
// (transfer/tcp/staging.h, FERRY_LAND_DEFER). Whatever holds work must see
// it run: RunAll before the thread waits on anything.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>

namespace ferry::held {

// Called with true where it runs before `depth` later pieces of work came.
using Work = std::function<void(bool early)>;

inline std::deque<Work>& Queue() {
  thread_local std::deque<Work> q;
  return q;
}

// Runs the oldest held while more than `keep` are held.
inline void RunPast(size_t keep, bool early) {
  auto& q = Queue();
  while (q.size() > keep) {
    Work oldest = std::move(q.front());
    q.pop_front();
    oldest(early);
  }
}

// Holds `w` on this thread; runs the oldest held, not early, while more
// than `depth` are held.
inline void Hold(size_t depth, Work w) {
  Queue().push_back(std::move(w));
  RunPast(depth, false);
}

// Runs everything this thread holds, early, oldest first. Cheap when none.
inline void RunAll() { RunPast(0, true); }

}  // namespace ferry::held
