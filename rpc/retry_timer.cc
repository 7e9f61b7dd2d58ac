#include "rpc/retry_timer.h"

#include "absl/time/clock.h"

#include <vector>

namespace pstrain {

RetryTimer::RetryTimer() : thread_([this] { Loop(); }) {}

RetryTimer::~RetryTimer() {
  std::multimap<absl::Time, std::function<void(bool)>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(pending_);
  }
  for (auto& [when, fn] : left) fn(false);
}

void RetryTimer::RunAt(absl::Time when, std::function<void(bool)> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      pending_.emplace(when, std::move(fn));
      cv_.notify_all();
      return;
    }
  }
  fn(false);
}

void RetryTimer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (pending_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const absl::Time next = pending_.begin()->first;
    if (absl::Now() < next) {
      cv_.wait_until(lock, absl::ToChronoTime(next));
      continue;
    }
    std::vector<std::function<void(bool)>> due;
    while (!pending_.empty() && pending_.begin()->first <= absl::Now()) {
      due.push_back(std::move(pending_.begin()->second));
      pending_.erase(pending_.begin());
    }
    lock.unlock();
    for (auto& fn : due) fn(true);  // never under the lock
    lock.lock();
  }
}

}  // namespace pstrain
