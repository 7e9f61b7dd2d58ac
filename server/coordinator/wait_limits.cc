#include "server/coordinator/wait_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace pstrain {
namespace {

absl::Status GlobalLimitReached(absl::string_view what, size_t limit) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the coordinator already holds ", limit, " waiting calls (watches, KvGet and GetAssignment "
                   "waits), its limit (--max_waiting_calls): this ", what, " is refused; try again later"));
}

}  // namespace

WaitLimits::Slot& WaitLimits::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    limits_ = std::exchange(other.limits_, nullptr);
    user_ = std::move(other.user_);
    watch_ = other.watch_;
  }
  return *this;
}

void WaitLimits::Slot::Release() {
  if (limits_ == nullptr) return;
  std::exchange(limits_, nullptr)->Release(user_, watch_);
}

absl::StatusOr<WaitLimits::Slot> WaitLimits::AcquireWatch(const std::string& user) {
  absl::MutexLock lock(&mu_);
  if (options_.max_waiting_calls > 0 && waiting_ >= options_.max_waiting_calls) {
    return GlobalLimitReached("watch", options_.max_waiting_calls);
  }
  auto it = watches_.find(user);
  const size_t open = it == watches_.end() ? 0 : it->second;
  if (options_.max_watches_per_user > 0 && open >= options_.max_watches_per_user) {
    return absl::ResourceExhaustedError(
        absl::StrCat("user ", Quote(user, 64), " already has ", open, " watches open, the limit per user "
                     "(--max_watches_per_user): close one first"));
  }
  ++waiting_;
  ++watches_[user];
  return Slot(this, user, /*watch=*/true);
}

absl::StatusOr<WaitLimits::Slot> WaitLimits::AcquireWait(absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (options_.max_waiting_calls > 0 && waiting_ >= options_.max_waiting_calls) {
    return GlobalLimitReached(what, options_.max_waiting_calls);
  }
  ++waiting_;
  return Slot(this, "", /*watch=*/false);
}

void WaitLimits::Release(const std::string& user, bool watch) {
  absl::MutexLock lock(&mu_);
  --waiting_;
  if (!watch) return;
  auto it = watches_.find(user);
  if (it != watches_.end() && --it->second == 0) watches_.erase(it);
}

size_t WaitLimits::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

size_t WaitLimits::watches(const std::string& user) const {
  absl::MutexLock lock(&mu_);
  auto it = watches_.find(user);
  return it == watches_.end() ? 0 : it->second;
}

}  // namespace pstrain
