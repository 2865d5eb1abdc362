#include "transfer/batch.h"

#include <thread>

#include "common/env.h"
#include "common/event_trace.h"
#include "common/log.h"
#include "ferry/engine.h"

namespace ferry {
namespace {

// WaitDone looks this long before it sleeps: a small GPU copy ends within
// microseconds, sooner than a sleeping thread is woken. FERRY_WAIT_SPIN_US
// (0 to 1000) sets it, to compare; a bad value is logged and the default kept.
std::chrono::microseconds WaitSpin() {
  static const std::chrono::microseconds spin(env::GetIntIn("FERRY_WAIT_SPIN_US", 0, 1000, 50));
  return spin;
}

}  // namespace

BatchState::BatchState(size_t requests) : requests_(requests) {}

void BatchState::Plan(size_t index, uint32_t tasks, std::string_view transport) {
  Req& r = requests_[index];
  r.tasks_left.store(tasks, std::memory_order_relaxed);
  r.transport = transport;
  tasks_outstanding_.fetch_add(tasks, std::memory_order_relaxed);
}

bool BatchState::Finish(Req& r) {
  // Done before counted: whoever sees the count (Poll, WaitDone) sees it.
  r.done.store(true, std::memory_order_release);
  if (r.failed.load(std::memory_order_acquire)) {
    std::lock_guard lk(mu_);
    if (first_error_.ok()) first_error_ = r.status;
    failed_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    succeeded_.fetch_add(1, std::memory_order_acq_rel);
  }
  return finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == requests_.size();
}

void BatchState::Wake() {
  { std::lock_guard lk(mu_); }
  cv_.notify_all();
}

void BatchState::FailRequest(size_t index, Status status) {
  Req& r = requests_[index];
  {
    std::lock_guard lk(mu_);
    r.status = std::move(status);
    r.failed.store(true, std::memory_order_release);
  }
  Finish(r);
  Wake();
}

void BatchState::TaskDone(size_t index, const Status& status) {
  Req& r = requests_[index];
  if (!status.ok()) {
    std::lock_guard lk(mu_);
    if (!r.failed.load(std::memory_order_relaxed)) {
      r.status = status;
      r.failed.store(true, std::memory_order_release);
    }
  }
  // Waiters want the whole batch done or every task released; the other
  // completions wake no one.
  bool wake = r.tasks_left.fetch_sub(1, std::memory_order_acq_rel) == 1 && Finish(r);
  if (tasks_outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) wake = true;
  if (wake) Wake();
}

BatchStatus BatchState::Poll() const {
  BatchStatus s;
  s.total = requests_.size();
  std::lock_guard lk(mu_);
  s.succeeded = succeeded_.load(std::memory_order_acquire);
  s.failed = failed_.load(std::memory_order_acquire);
  s.first_error = first_error_;
  return s;
}

RequestResult BatchState::Result(size_t index) const {
  if (index >= requests_.size()) {
    return {true, Status::OutOfRange("request index past the batch"), kNoTransport};
  }
  const Req& r = requests_[index];
  const bool done = r.done.load(std::memory_order_acquire);
  std::lock_guard lk(mu_);
  return {done, r.status, r.transport};
}

bool BatchState::WaitDone(Deadline deadline) {
  // The sum Poll reports, so the two never disagree.
  auto all = [&] {
    return succeeded_.load(std::memory_order_acquire) + failed_.load(std::memory_order_acquire) ==
           requests_.size();
  };
  const auto spin_end = std::min(deadline.at(), Clock::now() + WaitSpin());
  while (!all() && Clock::now() < spin_end) std::this_thread::yield();
  std::unique_lock lk(mu_);
  const bool done = cv_.wait_until(lk, deadline.at(), all);
  FERRY_TRACE(trace::kWaitDone, 0);
  return done;
}

bool BatchState::WaitQuiescent(Deadline deadline) {
  std::unique_lock lk(mu_);
  return cv_.wait_until(lk, deadline.at(),
                        [&] { return tasks_outstanding_.load(std::memory_order_acquire) == 0; });
}

void BatchState::NoteDeadline(Deadline d) {
  std::lock_guard lk(mu_);
  if (d.at() > latest_.at()) latest_ = d;
}

Deadline BatchState::latest_deadline() const {
  std::lock_guard lk(mu_);
  return latest_;
}

// ---- Batch, the user's handle ----

Batch::Batch(std::shared_ptr<BatchState> state) : state_(std::move(state)) {}

Batch::~Batch() {
  state_->Cancel();
  // Bounded: every held task has a deadline that its transport enforces.
  Deadline limit(state_->latest_deadline().at() + std::chrono::seconds(5));
  if (!state_->WaitQuiescent(limit)) {
    FERRY_LOG_ERROR("batch freed while a transport still held its tasks past their deadline");
  }
}

size_t Batch::size() const { return state_->size(); }
BatchStatus Batch::Poll() const { return state_->Poll(); }
RequestResult Batch::Result(size_t index) const { return state_->Result(index); }

Status Batch::Wait(std::chrono::milliseconds timeout) {
  if (!state_->WaitDone(Deadline::After(timeout))) {
    return Status::Timeout("batch not done within " + std::to_string(timeout.count()) + " ms");
  }
  return state_->Poll().first_error;
}

}  // namespace ferry
