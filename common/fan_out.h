// FanOut: the outcome of several asynchronous calls started together (one
// request per shard, say). It counts the calls started and not yet ended,
// keeps the first error any of them reports, and lets the starter wait for
// them all -- or, where nobody may block, tells the call that ended last.
//
// Thread-safe: Add and Wait on the starter's thread, Done on whatever
// thread a call ends on (a gRPC thread). The FanOut must outlive every
// call's Done; once Wait returned (or the last Done returned true) nothing
// else touches it, so it may live on the waiter's stack.
#ifndef PSTRAIN_COMMON_FAN_OUT_H_
#define PSTRAIN_COMMON_FAN_OUT_H_

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

class FanOut {
 public:
  FanOut() = default;
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // `n` more calls started: each must end with one Done.
  void Add(int n = 1);
  // One call ended. An error is kept if it is the first since the last
  // Wait. Returns true to the Done that left no call outstanding: that
  // caller may take the outcome with Wait, which then does not block.
  bool Done(const absl::Status& status);
  // Blocks until no call is outstanding (at once if none was started),
  // then returns the first error (OK if none) and forgets it, so one
  // FanOut serves round after round.
  absl::Status Wait();
  // Waits up to `timeout` for no call to be outstanding; true if none is.
  // The outcome stays for Wait.
  bool Settled(absl::Duration timeout);

 private:
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_FAN_OUT_H_
