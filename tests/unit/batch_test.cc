// A batch's bookkeeping: counts and the first error; and the queue a peer's
// tcp lanes take its tasks from.
#include "transfer/batch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "ferry/status.h"
#include "transfer/tcp/lane.h"

namespace ferry {
namespace {

TEST(BatchState, CountsTasksAndReportsTheFirstError) {
  auto b = std::make_shared<BatchState>(3);
  b->Plan(0, 2, "tcp");
  b->Plan(1, 1, "shm");
  b->FailRequest(2, Status::Unavailable("down"));
  EXPECT_FALSE(b->Poll().done());
  b->TaskDone(0, Status::Ok());
  EXPECT_FALSE(b->Result(0).done);
  b->TaskDone(0, Status::Timeout("late"));
  EXPECT_TRUE(b->Result(0).done);
  EXPECT_EQ(b->Result(0).status.code(), StatusCode::kTimeout);
  EXPECT_FALSE(b->WaitDone(Deadline::After(Millis(10))));
  b->TaskDone(1, Status::Ok());
  EXPECT_TRUE(b->WaitDone(Deadline::After(Millis(10))));
  BatchStatus s = b->Poll();
  EXPECT_EQ(s.succeeded, 1u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.first_error.code(), StatusCode::kUnavailable);
  EXPECT_EQ(b->Result(1).transport, "shm");
  EXPECT_EQ(b->Result(5).transport, kNoTransport);
  EXPECT_EQ(b->Result(5).status.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(b->WaitQuiescent(Deadline::After(Millis(10))));
}

// Tasks of requests first, first+1, ... of `b`, one each, with the given
// lengths and deadlines.
std::vector<Task> TasksOf(const std::shared_ptr<BatchState>& b, std::vector<uint64_t> lengths,
                          std::vector<Deadline> deadlines, size_t first = 0) {
  std::vector<Task> out;
  for (size_t i = 0; i < lengths.size(); ++i) {
    b->Plan(first + i, 1, "tcp");
    Task t;
    t.index = static_cast<uint32_t>(first + i);
    t.length = lengths[i];
    t.deadline = deadlines[i];
    t.batch = b;
    out.push_back(std::move(t));
  }
  return out;
}

TEST(ChunkQueue, TakesFromTheFrontWhileTheWindowFitsAndKeepsTheRest) {
  auto b = std::make_shared<BatchState>(3);
  const Deadline later = Deadline::After(Millis(60000));
  ChunkQueue q;
  q.Push(TasksOf(b, {100, 200, 300}, {later, later, later}));
  std::vector<Task> got;
  uint64_t bytes = 0;
  q.TakeWhile(
      [&](const Task& t) {
        if (bytes + t.length > 300) return false;
        bytes += t.length;
        return true;
      },
      &got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].length, 100u);
  EXPECT_EQ(got[1].length, 200u);
  EXPECT_FALSE(q.empty());
  // The one left is still there for the next taker, and nothing was failed.
  EXPECT_EQ(b->Poll().failed, 0u);
  got.clear();
  q.TakeWhile([](const Task&) { return true; }, &got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].length, 300u);
  EXPECT_TRUE(q.empty());
}

// Shared by 4 lanes, 10 queued: a lane takes 3 (10/4 rounded up), however
// much its window would allow, so the lanes after it find work too.
TEST(ChunkQueue, ALaneTakesAFairShareOfASharedQueue) {
  auto b = std::make_shared<BatchState>(10);
  const Deadline later = Deadline::After(Millis(60000));
  ChunkQueue q(4);
  q.Push(TasksOf(b, std::vector<uint64_t>(10, 1), std::vector<Deadline>(10, later)));
  std::vector<Task> got;
  q.TakeWhile([](const Task&) { return true; }, &got);
  EXPECT_EQ(got.size(), 3u);
  got.clear();
  q.TakeWhile([](const Task&) { return true; }, &got);  // 7 left: 2
  EXPECT_EQ(got.size(), 2u);
}

TEST(ChunkQueue, ExpiredTasksFailWithTimeoutOthersStay) {
  auto b = std::make_shared<BatchState>(2);
  ChunkQueue q;
  q.Push(TasksOf(b, {1, 2}, {Deadline::After(Millis(0)), Deadline::After(Millis(60000))}));
  q.FailExpired();
  EXPECT_TRUE(b->Result(0).done);
  EXPECT_EQ(b->Result(0).status.code(), StatusCode::kTimeout);
  EXPECT_FALSE(b->Result(1).done);
  EXPECT_FALSE(q.empty());
}

TEST(ChunkQueue, ClosedFailsWhatItHeldAndWhatComesLater) {
  auto held = std::make_shared<BatchState>(1);
  auto late = std::make_shared<BatchState>(1);
  const Deadline later = Deadline::After(Millis(60000));
  ChunkQueue q;
  q.Push(TasksOf(held, {1}, {later}));
  q.Close();
  EXPECT_EQ(held->Result(0).status.code(), StatusCode::kCancelled);
  q.Push(TasksOf(late, {1}, {later}));
  EXPECT_EQ(late->Result(0).status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(q.empty());
}

// Eight threads complete a batch's tasks at once, as eight lanes' io threads
// do, some with errors: each request is counted once, with an error of its
// own; the waiter wakes only once the last task is in; and a batch that
// Poll calls done is done for WaitDone and Result too.
TEST(BatchState, TasksCompletedFromManyThreadsAtOnceCountEachRequestOnce) {
  constexpr size_t kRequests = 4000, kThreads = 8;
  auto b = std::make_shared<BatchState>(kRequests);
  for (size_t i = 0; i < kRequests; ++i) b->Plan(i, 2, "tcp");
  // Request i's two tasks go to two different threads; every 7th request's
  // first task fails with Timeout, every 11th's second with Unavailable.
  auto error = [](size_t i, int task) {
    if (task == 0 && i % 7 == 0) return Status::Timeout("late");
    if (task == 1 && i % 11 == 0) return Status::Unavailable("down");
    return Status::Ok();
  };
  std::atomic<bool> waited{false}, agreed{false};
  std::thread waiter([&] { waited = b->WaitDone(Deadline::After(Millis(60000))); });
  std::thread poller([&] {
    const Deadline limit = Deadline::After(Millis(60000));
    while (!b->Poll().done() && !limit.Expired()) std::this_thread::yield();
    agreed = b->WaitDone(Deadline::After(Millis(0))) && b->Result(kRequests - 1).done;
  });
  std::vector<std::thread> lanes;
  for (size_t k = 0; k < kThreads; ++k) {
    lanes.emplace_back([&, k] {
      for (size_t i = 0; i < kRequests; ++i) {
        for (int task = 0; task < 2; ++task) {
          if ((i + static_cast<size_t>(task)) % kThreads != k) continue;
          if (i == kRequests - 1 && task == 1) continue;  // held back
          b->TaskDone(i, error(i, task));
        }
      }
    });
  }
  for (auto& t : lanes) t.join();
  EXPECT_FALSE(b->WaitDone(Deadline::After(Millis(20))));
  EXPECT_FALSE(b->Poll().done());
  EXPECT_FALSE(b->Result(kRequests - 1).done);
  EXPECT_FALSE(b->WaitQuiescent(Deadline::After(Millis(1))));
  b->TaskDone(kRequests - 1, Status::Ok());
  waiter.join();
  poller.join();
  EXPECT_TRUE(waited);
  EXPECT_TRUE(agreed);
  EXPECT_TRUE(b->WaitQuiescent(Deadline::After(Millis(10))));
  size_t failed = 0;
  for (size_t i = 0; i < kRequests; ++i) {
    const StatusCode first = error(i, 0).code(), second = error(i, 1).code();
    RequestResult r = b->Result(i);
    EXPECT_TRUE(r.done) << i;
    if (first == StatusCode::kOk && second == StatusCode::kOk) {
      EXPECT_TRUE(r.status.ok()) << i;
      continue;
    }
    ++failed;
    // Both failed: whichever came first, on its own thread.
    if (first != StatusCode::kOk && second != StatusCode::kOk) {
      EXPECT_TRUE(r.status.code() == first || r.status.code() == second) << i;
    } else {
      EXPECT_EQ(r.status.code(), first != StatusCode::kOk ? first : second) << i;
    }
  }
  BatchStatus s = b->Poll();
  EXPECT_EQ(s.failed, failed);
  EXPECT_EQ(s.succeeded, kRequests - failed);
  EXPECT_FALSE(s.first_error.ok());
}

// Lanes on eight threads take from one shared queue while tasks are still
// pushed: every task goes to exactly one lane.
TEST(ChunkQueue, LanesTakingAtOnceGetEachTaskOnce) {
  constexpr size_t kTasks = 20000, kLanes = 8, kPushes = 100;
  auto b = std::make_shared<BatchState>(kTasks);
  const Deadline later = Deadline::After(Millis(60000));
  ChunkQueue q(kLanes);
  std::vector<std::atomic<int>> taken(kTasks);
  std::atomic<size_t> total{0};
  std::vector<std::thread> lanes;
  for (size_t k = 0; k < kLanes; ++k) {
    lanes.emplace_back([&] {
      std::vector<Task> got;
      // A lost task fails the count below instead of hanging the test.
      const Deadline limit = Deadline::After(Millis(30000));
      while (total.load() < kTasks && !limit.Expired()) {
        got.clear();
        q.TakeWhile([&](const Task&) { return got.size() < 4; }, &got);
        for (const Task& t : got) taken[t.index].fetch_add(1);
        total.fetch_add(got.size());
        if (got.empty()) std::this_thread::yield();
      }
    });
  }
  constexpr size_t kPerPush = kTasks / kPushes;
  for (size_t p = 0; p < kPushes; ++p) {
    q.Push(TasksOf(b, std::vector<uint64_t>(kPerPush, 1), std::vector<Deadline>(kPerPush, later),
                   p * kPerPush));
  }
  for (auto& t : lanes) t.join();
  EXPECT_EQ(total.load(), kTasks);
  for (size_t i = 0; i < kTasks; ++i) EXPECT_EQ(taken[i].load(), 1) << i;
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace ferry
