#include "common/fan_out.h"

namespace pstrain {

void FanOut::Add(int n) {
  absl::MutexLock lock(&mu_);
  outstanding_ += n;
}

bool FanOut::Done(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok() && first_error_.ok()) first_error_ = status;
  return --outstanding_ == 0;
}

absl::Status FanOut::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* outstanding) { return *outstanding == 0; }, &outstanding_));
  absl::Status status = std::move(first_error_);
  first_error_ = absl::OkStatus();
  return status;
}

bool FanOut::Settled(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](int* outstanding) { return *outstanding == 0; }, &outstanding_),
                              timeout);
}

}  // namespace pstrain
