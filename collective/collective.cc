#include "collective/collective.h"

#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "collective/collective_internal.h"

namespace pstrain {
namespace {

class InMemoryStore : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return kv_.count(key) > 0; })) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' was not set in time"));
    }
    return kv_[key];
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    if (kv_.count(key) > 0 && !absl::SimpleAtoi(kv_[key], &n)) {
      return absl::FailedPreconditionError(absl::StrCat("key '", key, "' does not hold a number"));
    }
    kv_[key] = std::to_string(n + delta);
    cv_.notify_all();
    return n + delta;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

}  // namespace

std::shared_ptr<KeyValueStore> NewInMemoryStore() { return std::make_shared<InMemoryStore>(); }

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(const std::string& backend,
                                                             const CollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("need 0 <= rank < size (", options.rank, ", ", options.size, ")"));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("a collective needs a rendezvous store");
  if (backend == "gloo") return CreateGlooCollective(options);
  if (backend == "nccl") return CreateNcclCollective(options);
  return absl::InvalidArgumentError(absl::StrCat("unknown collective backend '", backend, "': use gloo or nccl"));
}

}  // namespace pstrain
