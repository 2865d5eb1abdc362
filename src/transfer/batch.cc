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
  std::lock_guard lk(mu_);
  Req& r = requests_[index];
  r.tasks_left = tasks;
  r.transport = transport;
  tasks_outstanding_ += tasks;
}

void BatchState::FinishLocked(Req& r) {
  r.done = true;
  finished_.fetch_add(1, std::memory_order_release);
  if (r.status.ok()) {
    ++succeeded_;
  } else {
    ++failed_;
    if (first_error_.ok()) first_error_ = r.status;
  }
}

void BatchState::FailRequest(size_t index, Status status) {
  {
    std::lock_guard lk(mu_);
    Req& r = requests_[index];
    r.status = std::move(status);
    FinishLocked(r);
  }
  cv_.notify_all();
}

void BatchState::TaskDone(size_t index, const Status& status) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    Req& r = requests_[index];
    if (!status.ok() && r.status.ok()) r.status = status;
    --tasks_outstanding_;
    if (--r.tasks_left == 0) FinishLocked(r);
    // Waiters want the whole batch done or every task released; skip the
    // futex wake on every other completion.
    wake = tasks_outstanding_ == 0 || succeeded_ + failed_ == requests_.size();
  }
  if (wake) cv_.notify_all();
}

BatchStatus BatchState::Poll() const {
  std::lock_guard lk(mu_);
  BatchStatus s;
  s.total = requests_.size();
  s.succeeded = succeeded_;
  s.failed = failed_;
  s.first_error = first_error_;
  return s;
}

RequestResult BatchState::Result(size_t index) const {
  std::lock_guard lk(mu_);
  if (index >= requests_.size()) {
    return {true, Status::OutOfRange("request index past the batch"), kNoTransport};
  }
  const Req& r = requests_[index];
  return {r.done, r.status, r.transport};
}

bool BatchState::WaitDone(Deadline deadline) {
  const auto spin_end = std::min(deadline.at(), Clock::now() + WaitSpin());
  while (finished_.load(std::memory_order_acquire) < requests_.size() && Clock::now() < spin_end) {
    std::this_thread::yield();
  }
  std::unique_lock lk(mu_);
  const bool done =
      cv_.wait_until(lk, deadline.at(), [&] { return succeeded_ + failed_ == requests_.size(); });
  FERRY_TRACE(trace::kWaitDone, 0);
  return done;
}

bool BatchState::WaitQuiescent(Deadline deadline) {
  std::unique_lock lk(mu_);
  return cv_.wait_until(lk, deadline.at(), [&] { return tasks_outstanding_ == 0; });
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
