// Clock: where time comes from, so code that keeps leases and deadlines can
// be tested by moving time instead of sleeping. Waits on a caller's RPC
// deadline stay on real time (the caller's clock is real).
#ifndef PSTRAIN_COMMON_CLOCK_H_
#define PSTRAIN_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pstrain {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // absl::Now(); lives forever.
  static Clock* Real();
};

// A clock that moves only when told (tests). Thread-safe.
class ManualClock : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* Clock::Real() {
  struct RealClock : Clock {
    absl::Time Now() const override { return absl::Now(); }
  };
  static RealClock* const clock = new RealClock;
  return clock;
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CLOCK_H_
