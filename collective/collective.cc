#include "collective/collective.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collective/collective_internal.h"

namespace pstrain {
namespace {

class InMemoryStore : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    kv_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    const auto is_set = [&] { return kv_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&is_set), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' was not set in time"));
    }
    return kv_[key];
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    absl::MutexLock lock(&mu_);
    int64_t n = 0;
    if (kv_.count(key) > 0 && !absl::SimpleAtoi(kv_[key], &n)) {
      return absl::FailedPreconditionError(absl::StrCat("key '", key, "' does not hold a number"));
    }
    kv_[key] = std::to_string(n + delta);
    return n + delta;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<KeyValueStore> NewInMemoryStore() { return std::make_shared<InMemoryStore>(); }

const char* Name(Collective::Backend backend) {
  switch (backend) {
    case Collective::Backend::kGloo: return "gloo";
    case Collective::Backend::kNccl: return "nccl";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(Collective::Backend backend,
                                                             const CollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("need 0 <= rank < size (", options.rank, ", ", options.size, ")"));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("a collective needs a rendezvous store");
  switch (backend) {
    case Collective::Backend::kGloo: return CreateGlooCollective(options);
    case Collective::Backend::kNccl: return CreateNcclCollective(options);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown collective backend ", static_cast<int>(backend)));
}

}  // namespace pstrain
