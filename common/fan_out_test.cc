#include "common/fan_out.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(FanOutTest, NoCallsWaitsForNothing) {
  FanOut calls;
  EXPECT_TRUE(calls.Wait().ok());
}

TEST(FanOutTest, KeepsTheFirstError) {
  FanOut calls;
  calls.Add(3);
  EXPECT_FALSE(calls.Done(absl::OkStatus()));
  EXPECT_FALSE(calls.Done(absl::UnavailableError("first")));
  EXPECT_TRUE(calls.Done(absl::InternalError("second")));
  EXPECT_EQ(calls.Wait(), absl::UnavailableError("first"));
}

TEST(FanOutTest, WaitForgetsTheErrorForTheNextRound) {
  FanOut calls;
  calls.Add();
  calls.Done(absl::AbortedError("round 1"));
  EXPECT_EQ(calls.Wait().code(), absl::StatusCode::kAborted);
  calls.Add();
  calls.Done(absl::OkStatus());
  EXPECT_TRUE(calls.Wait().ok());
}

TEST(FanOutTest, WaitsForEveryCall) {
  FanOut calls;
  calls.Add(2);
  calls.Done(absl::OkStatus());
  absl::Notification returned;
  std::thread waiter([&] {
    EXPECT_TRUE(calls.Wait().ok());
    returned.Notify();
  });
  // One call is still outstanding: Wait must not have returned.
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_TRUE(calls.Done(absl::OkStatus()));
  waiter.join();
  EXPECT_TRUE(returned.HasBeenNotified());
}

TEST(FanOutTest, CallsEndingOnManyThreads) {
  constexpr int kThreads = 8, kCallsPerThread = 1000;
  FanOut calls;
  calls.Add(kThreads * kCallsPerThread);
  std::atomic<int> lasts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        // Thread 3's call 500 fails; every other call succeeds.
        const bool fail = t == 3 && i == 500;
        if (calls.Done(fail ? absl::NotFoundError("thread 3") : absl::OkStatus())) ++lasts;
      }
    });
  }
  EXPECT_EQ(calls.Wait(), absl::NotFoundError("thread 3"));
  for (auto& t : threads) t.join();
  EXPECT_EQ(lasts.load(), 1);
}

}  // namespace
}  // namespace pstrain
