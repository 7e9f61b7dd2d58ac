#include "server/ps/job_secrets.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace pstrain {

absl::Status JobSecrets::Check(const std::string& job, absl::string_view presented) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job);
  if (it == entries_.end() || !it->second.recorded || it->second.secret.empty()) return absl::OkStatus();
  const std::string& want = it->second.secret;
  if (presented.size() == want.size() && CRYPTO_memcmp(presented.data(), want.data(), want.size()) == 0) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("this shard serves job ", Quote(job),
                                                  "'s table only to the job's own members (the job secret of "
                                                  "their assignment)"));
}

std::string JobSecrets::SecretOf(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job);
  return it == entries_.end() || !it->second.recorded ? std::string() : it->second.secret;
}

void JobSecrets::BeginMake(const std::string& job) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[job];
  ++e.makes_in_flight;
  e.last_make = ++makes_begun_;
}

void JobSecrets::EndMake(const std::string& job, bool made, absl::string_view presented) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job);
  if (it == entries_.end()) return;  // no BeginMake: a caller's bug, nothing to undo
  Entry& e = it->second;
  if (e.makes_in_flight > 0) --e.makes_in_flight;
  if (made && !e.recorded) {
    e.recorded = true;
    e.secret = std::string(presented);
  }
  Tidy(it);
}

JobSecrets::DropTicket JobSecrets::BeginDrop(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job);
  if (it == entries_.end()) return {};
  return {it->second.last_make, it->second.makes_in_flight > 0};
}

void JobSecrets::EndDrop(const std::string& job, const DropTicket& ticket, bool dropped) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job);
  if (!dropped || it == entries_.end()) return;
  Entry& e = it->second;
  // A make that began before the drop and was still running, or began
  // since, may have made the table the store holds now: keep its secret.
  if (ticket.overlapped || e.makes_in_flight > 0 || e.last_make != ticket.last_make) return;
  e.recorded = false;
  e.secret.clear();
  Tidy(it);
}

void JobSecrets::Tidy(std::map<std::string, Entry>::iterator it) {
  if (!it->second.recorded && it->second.makes_in_flight == 0) entries_.erase(it);
}

}  // namespace pstrain
