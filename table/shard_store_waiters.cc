// Parked calls: a Pull with min_version, or a PushPull under SYNC or SSP,
// waits as a Waiter (never a blocked thread) until the pushes it needs
// arrive, its deadline passes (the reaper thread), its table is dropped or
// replaced, or the store shuts down.
#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::Unavailable;

void ShardStore::Shutdown() {
  std::list<std::shared_ptr<Waiter>> waiters;
  {
    absl::MutexLock lock(&waiters_mu_);
    if (shutdown_) return;
    shutdown_ = true;
    waiters.swap(waiters_);
    waiters_cv_.SignalAll();
  }
  for (auto& w : waiters) w->ready(Unavailable());
}

void ShardStore::AbortWaiters(const std::shared_ptr<Table>& table, const std::string& why) {
  std::vector<std::shared_ptr<Waiter>> orphans;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->table == table) {
        orphans.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : orphans) w->ready(absl::AbortedError(why));
}

void ShardStore::WhenReady(std::shared_ptr<Table> table, std::vector<size_t> chunks, bool by_clock,
                           int64_t threshold, absl::Time deadline, StatusCallback ready) {
  auto w = std::make_shared<Waiter>();
  w->table = std::move(table);
  w->chunks = std::move(chunks);
  w->by_clock = by_clock;
  w->threshold = threshold;
  w->deadline = std::min(deadline, absl::Now() + options_.max_wait);
  w->ready = std::move(ready);
  absl::Status now;
  {
    absl::MutexLock lock(&waiters_mu_);
    if (shutdown_) {
      now = Unavailable();
    } else if (!w->Satisfied()) {
      if (waiters_.size() >= options_.max_waiters) {
        now = absl::ResourceExhaustedError(absl::StrCat("shard ", options_.shard_index, " already has ",
                                                        waiters_.size(), " waiting calls, its limit"));
      } else {
        waiters_.push_back(w);
        waiters_cv_.SignalAll();  // the reaper may need an earlier wake-up
        return;
      }
    }
  }
  w->ready(now);
}

void ShardStore::NotifyWaiters() {
  std::vector<std::shared_ptr<Waiter>> fired;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->Satisfied()) {
        fired.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : fired) w->ready(absl::OkStatus());
}

void ShardStore::ReaperLoop() {
  absl::MutexLock lock(&waiters_mu_);
  while (!shutdown_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& w : waiters_) next = std::min(next, w->deadline);
    if (next == absl::InfiniteFuture()) {
      waiters_cv_.Wait(&waiters_mu_);
    } else {
      waiters_cv_.WaitWithDeadline(&waiters_mu_, next);
    }
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Waiter>> expired;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->deadline <= now) {
        expired.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (expired.empty()) continue;
    waiters_mu_.Unlock();
    for (auto& w : expired) {
      w->ready(absl::DeadlineExceededError(absl::StrCat("deadline passed while waiting on job '",
                                                        Quote(w->table->job), "': ", w->Lagging(),
                                                        "; a worker may have died or fallen behind")));
    }
    waiters_mu_.Lock();
  }
}

}  // namespace pstrain
