#include "common/event_trace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ferry::trace {
namespace {

struct Event {
  int64_t ns;
  uint32_t stage;
  uint64_t key;
};

class Log {
 public:
  static constexpr size_t kCapacity = size_t{1} << 22;

  Log() {
    const char* path = std::getenv("FERRY_TRACE_FILE");
    if (path == nullptr || *path == '\0') return;
    path_ = path;
    // Never freed: a thread may mark during exit. Zeroed now, so no mark
    // pays a page fault: untouched, the buffer faulted once per 170 events,
    // and traced batches ran about a tenth slower than untraced ones.
    events_ = new Event[kCapacity]();
    on_ = true;
  }
  ~Log() { Write(); }

  bool on() const { return on_; }

  void Add(Stage stage, uint64_t key, int64_t ns) {
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= kCapacity) return;
    events_[i] = {ns, stage, key};
  }

 private:
  void Write() {
    if (!on_) return;
    const std::string file = path_ + "." + std::to_string(getpid());
    FILE* f = std::fopen(file.c_str(), "w");
    if (f == nullptr) return;
    const size_t n = std::min(next_.load(), kCapacity);
    for (size_t i = 0; i < n; ++i) {
      std::fprintf(f, "%lld %u %llx\n", static_cast<long long>(events_[i].ns), events_[i].stage,
                   static_cast<unsigned long long>(events_[i].key));
    }
    std::fclose(f);
  }

  bool on_ = false;
  std::string path_;
  Event* events_ = nullptr;
  std::atomic<size_t> next_{0};
};

Log& TheLog() {
  static Log log;
  return log;
}

}  // namespace

namespace detail {
bool on = TheLog().on();
}  // namespace detail

int64_t NowNs() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
}

void Mark(Stage stage, uint64_t key) { TheLog().Add(stage, key, NowNs()); }
void MarkAt(Stage stage, uint64_t key, int64_t ns) { TheLog().Add(stage, key, ns); }

}  // namespace ferry::trace
