#include "table/parameter_store.h"

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

void ParameterStore::ReplicateAsync(const ReplicateRequest& /*request*/, std::vector<TensorBuffer> /*tensors*/,
                                    ReplicateResponse* /*response*/, const CallOptions& /*options*/,
                                    StatusCallback done) {
  done(absl::UnimplementedError("this parameter store does not hold replicated tables"));
}

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
