#include "table/parameter_store.h"

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

absl::Status WaitFor(const std::function<void(StatusCallback)>& call) {
  // Shared with the callback: the waiter may return, and its frame go,
  // while `done` is still unlocking mu.
  struct State {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  call([state](absl::Status s) {
    absl::MutexLock lock(&state->mu);
    state->status = std::move(s);
    state->done = true;
  });
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(&state->done));
  return state->status;
}

}  // namespace pstrain
