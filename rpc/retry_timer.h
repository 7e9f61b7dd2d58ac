// RetryTimer: runs callbacks at a later time on one thread of its own, for
// retry backoff. (grpc::Alarm is not used because its owner would have to
// outlive the callback that may drop the last reference to it.)
//
// Thread-safe. The destructor runs every pending callback at once with
// `false` (cancelled), so nothing waits on a retry that will never come.
#ifndef PSTRAIN_RPC_RETRY_TIMER_H_
#define PSTRAIN_RPC_RETRY_TIMER_H_

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pstrain {

class RetryTimer {
 public:
  RetryTimer();
  ~RetryTimer();

  // Runs fn(true) at `when` (or fn(false) if the timer is destroyed first).
  void RunAt(absl::Time when, std::function<void(bool)> fn);

 private:
  void Loop();

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::multimap<absl::Time, std::function<void(bool)>> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pstrain

#endif  // PSTRAIN_RPC_RETRY_TIMER_H_
