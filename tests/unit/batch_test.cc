// A batch's bookkeeping: counts and the first error.
#include <gtest/gtest.h>

#include <memory>

#include "ferry/status.h"
#include "transfer/batch.h"

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

// A Wake runs the job at once, and says so; without one, the period decides.

}  // namespace
}  // namespace ferry
