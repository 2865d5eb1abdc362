// The periodic-job thread, and the names of Ferry's threads.
#include "common/ticker.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "common/thread_pool.h"

namespace ferry {
namespace {

TEST(Ticker, WakeRunsTheJobAndThePeriodCanChange) {
  std::atomic<int> woken{0}, timed{0};
  Ticker t("test-ticker", std::chrono::hours(1), [&](bool w) { (w ? woken : timed).fetch_add(1); });
  t.Start();
  auto within = [](auto&& cond) {
    for (int i = 0; i < 1000 && !cond(); ++i) std::this_thread::sleep_for(Millis(5));
    return cond();
  };
  t.Wake();
  EXPECT_TRUE(within([&] { return t.runs() >= 1; })) << "a Wake did not run the job";
  EXPECT_EQ(woken.load(), 1);
  EXPECT_EQ(timed.load(), 0);
  t.SetPeriod(Millis(1));
  t.Wake();  // ends the hour-long wait; the next ones take the new period
  EXPECT_TRUE(within([&] { return timed.load() >= 3; })) << "the new period did not apply";
}

std::string ThisThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// Ferry's threads carry names, cut to the kernel's 15 characters.
TEST(ThreadNames, PoolsAndTickersNameTheirThreads) {
  std::promise<std::string> pool_name, ticker_name;
  {
    ThreadPool pool(1, "test-pool-with-a-long-name");
    pool.Post([&] { pool_name.set_value(ThisThreadName()); });
    std::atomic<bool> named{false};
    Ticker t("test-ticker", std::chrono::hours(1), [&](bool) {
      if (!named.exchange(true)) ticker_name.set_value(ThisThreadName());
    });
    t.Start();
    t.Wake();
    EXPECT_EQ(ticker_name.get_future().get(), "test-ticker");
  }
  EXPECT_EQ(pool_name.get_future().get(), "test-pool-with-");
}

}  // namespace
}  // namespace ferry
