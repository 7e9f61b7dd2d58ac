#include "server/coordinator/rendezvous.h"

#include <gtest/gtest.h>

#include <thread>

namespace pstrain {
namespace {

TEST(RendezvousTest, GetWaitsForTheKey) {
  Rendezvous r(RendezvousLimits{});
  r.Open("j", 1);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_TRUE(r.Set("j", 1, "nccl_id", "abc").ok());
  });
  auto v = r.Get("j", 1, "nccl_id", absl::Now() + absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "abc");
  EXPECT_EQ(r.Get("j", 1, "missing", absl::Now()).status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousTest, OnlyTheOpenAttemptIsServed) {
  Rendezvous r(RendezvousLimits{});
  EXPECT_EQ(r.Set("j", 1, "k", "v").code(), absl::StatusCode::kNotFound);  // no such job
  r.Open("j", 1);
  ASSERT_TRUE(r.Set("j", 1, "k", "old").ok());
  EXPECT_EQ(r.Set("j", 2, "k", "v").code(), absl::StatusCode::kAborted);
  // Requeued: the attempt's members can no longer write, and what they
  // wrote is not seen by the next attempt.
  r.Close("j");
  EXPECT_EQ(r.Set("j", 1, "k", "late").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(r.Add("j", 1, "n", 1).status().code(), absl::StatusCode::kAborted);
  r.Open("j", 2);
  EXPECT_EQ(r.Get("j", 2, "k", absl::Now()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Get("j", 1, "k", absl::Now()).status().code(), absl::StatusCode::kAborted);
}

TEST(RendezvousTest, CloseAndShutdownWakeWaiters) {
  Rendezvous r(RendezvousLimits{});
  r.Open("j", 1);
  absl::Status got;
  std::thread waiter([&] { got = r.Get("j", 1, "never", absl::Now() + absl::Seconds(60)).status(); });
  absl::SleepFor(absl::Milliseconds(30));
  r.Close("j");
  waiter.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
  r.Open("j", 2);
  std::thread waiter2([&] { got = r.Get("j", 2, "never", absl::Now() + absl::Seconds(60)).status(); });
  absl::SleepFor(absl::Milliseconds(30));
  r.Shutdown();
  waiter2.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
}

TEST(RendezvousTest, BoundedInKeysAndBytes) {
  RendezvousLimits limits;
  limits.max_keys = 2;
  limits.max_value_bytes = 8;
  limits.max_bytes = 12;
  Rendezvous r(limits);
  r.Open("j", 1);
  EXPECT_EQ(r.Set("j", 1, "", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Set("j", 1, std::string(kMaxKvKeyBytes + 1, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Set("j", 1, "k", std::string(9, 'v')).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(r.Set("j", 1, "a", "1234567").ok());  // 8 bytes
  EXPECT_EQ(r.Set("j", 1, "b", "12345").code(), absl::StatusCode::kResourceExhausted);  // 14 > 12
  ASSERT_TRUE(r.Set("j", 1, "a", "1").ok());  // replacing frees the old value's bytes
  ASSERT_TRUE(r.Set("j", 1, "b", "12345").ok());
  EXPECT_EQ(r.Set("j", 1, "c", "1").code(), absl::StatusCode::kResourceExhausted);  // keys
  // Add is held to the same bounds, and to int64.
  EXPECT_EQ(r.Add("j", 1, "c", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.Add("j", 1, "b", 1).status().code(), absl::StatusCode::kOk);
  ASSERT_TRUE(r.Set("j", 1, "a", "9").ok());
  EXPECT_EQ(r.Add("j", 1, "a", INT64_MAX).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*r.Get("j", 1, "a", absl::Now()), "9");
  ASSERT_TRUE(r.Set("j", 1, "a", "x").ok());
  EXPECT_EQ(r.Add("j", 1, "a", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pstrain
