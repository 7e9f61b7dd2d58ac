#include "table/parameter_store.h"

#include <condition_variable>
#include <memory>
#include <mutex>

namespace pstrain {

absl::Status WaitFor(const std::function<void(StatusCallback)>& call) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
  };
  auto state = std::make_shared<State>();
  call([state](absl::Status s) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->status = std::move(s);
    state->done = true;
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done; });
  return state->status;
}

}  // namespace pstrain
