#include "rpc/retry_timer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pstrain {
namespace {

TEST(RetryTimerTest, RunsCallbacksInTimeOrderAfterTheirTime) {
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<int> done{0};
  const absl::Time start = absl::Now();
  {
    RetryTimer timer;
    for (int i : {3, 1, 2}) {
      timer.RunAt(start + absl::Milliseconds(30 * i), [&, i](bool ok) {
        EXPECT_TRUE(ok);
        EXPECT_GE(absl::Now(), start + absl::Milliseconds(30 * i));
        absl::MutexLock lock(&mu);
        order.push_back(i);
        ++done;
      });
    }
    while (done < 3) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(RetryTimerTest, DestructionCancelsWhatIsPending) {
  bool called = false, ok = true;
  {
    RetryTimer timer;
    timer.RunAt(absl::Now() + absl::Hours(1), [&](bool r) {
      called = true;
      ok = r;
    });
  }
  EXPECT_TRUE(called);
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace pstrain
