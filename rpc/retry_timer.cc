#include "rpc/retry_timer.h"

#include "absl/time/clock.h"

#include <vector>

namespace pstrain {

RetryTimer::RetryTimer() : thread_([this] { Loop(); }) {}

RetryTimer::~RetryTimer() {
  std::multimap<absl::Time, std::function<void(bool)>> left;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
  {
    absl::MutexLock lock(&mu_);
    left.swap(pending_);
  }
  for (auto& [when, fn] : left) fn(false);
}

void RetryTimer::RunAt(absl::Time when, std::function<void(bool)> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      pending_.emplace(when, std::move(fn));
      cv_.SignalAll();
      return;
    }
  }
  fn(false);
}

void RetryTimer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (pending_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    const absl::Time next = pending_.begin()->first;
    if (absl::Now() < next) {
      cv_.WaitWithDeadline(&mu_, next);
      continue;
    }
    std::vector<std::function<void(bool)>> due;
    while (!pending_.empty() && pending_.begin()->first <= absl::Now()) {
      due.push_back(std::move(pending_.begin()->second));
      pending_.erase(pending_.begin());
    }
    mu_.Unlock();
    for (auto& fn : due) fn(true);  // never under the lock
    mu_.Lock();
  }
}

}  // namespace pstrain
