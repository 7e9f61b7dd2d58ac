#include "server/ps/job_secrets.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace pstrain {

absl::Status JobSecrets::Check(const std::string& job, absl::string_view presented) const {
  absl::MutexLock lock(&mu_);
  auto it = secrets_.find(job);
  if (it == secrets_.end() || it->second.empty()) return absl::OkStatus();
  const std::string& want = it->second;
  if (presented.size() == want.size() && CRYPTO_memcmp(presented.data(), want.data(), want.size()) == 0) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("this shard serves job ", Quote(job),
                                                  "'s table only to the job's own members (the job secret of "
                                                  "their assignment)"));
}

void JobSecrets::Record(const std::string& job, absl::string_view presented) {
  absl::MutexLock lock(&mu_);
  secrets_.emplace(job, std::string(presented));
}

void JobSecrets::Forget(const std::string& job) {
  absl::MutexLock lock(&mu_);
  secrets_.erase(job);
}

}  // namespace pstrain
