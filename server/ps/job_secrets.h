// JobSecrets: which job secret (Assignment.job_secret) each table on this
// shard belongs to. The first successful InitTable or LoadTable of a job
// records the secret its caller sent; from then on every call for the job
// must send the same one (PERMISSION_DENIED otherwise, compared in constant
// time), until a successful DropTable forgets it. So a cluster member that
// is not one of the job's -- another job's worker -- cannot read, push
// into, save over or drop the job's table. A job without a secret (empty,
// as from a coordinator before this existed) is open to every cluster
// member, as before.
//
// Ordering with the store: the store's calls are asynchronous, so a
// DropTable's completion may be seen here after a table-making call
// (InitTable/LoadTable of the next attempt) that the store ran after the
// drop. Forgetting then would leave the new table with no secret, open to
// every cluster member. So each table change is bracketed (Begin... before
// the store call, End... after it, whatever its outcome), and a drop forgets
// the secret only if no table-making call of the job overlapped it; if one
// did, the secret is kept (closed rather than open: it is the job's own
// secret, which the next attempt's calls send too).
//
// Thread-safe; one mutex, never held while calling out.
#ifndef PSTRAIN_SERVER_PS_JOB_SECRETS_H_
#define PSTRAIN_SERVER_PS_JOB_SECRETS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

class JobSecrets {
 public:
  // What BeginDrop saw, for EndDrop.
  struct DropTicket {
    uint64_t last_make = 0;   // the job's latest make (0: none)
    bool overlapped = false;  // a table-making call was in flight already
  };

  // OK when the job has no recorded secret or `presented` is it.
  absl::Status Check(const std::string& job, absl::string_view presented) const ABSL_LOCKS_EXCLUDED(mu_);
  // The job's recorded secret (empty if none): what this shard presents
  // when it forwards the job's updates to another shard.
  std::string SecretOf(const std::string& job) const ABSL_LOCKS_EXCLUDED(mu_);
  // Before an InitTable/LoadTable reaches the store.
  void BeginMake(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  // After it: if `made` (it succeeded), records `presented` unless the job
  // has a secret already.
  void EndMake(const std::string& job, bool made, absl::string_view presented) ABSL_LOCKS_EXCLUDED(mu_);
  // Before a DropTable reaches the store.
  DropTicket BeginDrop(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  // After it: if `dropped` (it succeeded) and no table-making call of the
  // job overlapped it, forgets the job's secret.
  void EndDrop(const std::string& job, const DropTicket& ticket, bool dropped) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    bool recorded = false;
    std::string secret;
    uint32_t makes_in_flight = 0;
    uint64_t last_make = 0;  // the number (makes_begun_) of its latest BeginMake
  };
  // Removes `it` if it holds nothing any more.
  void Tidy(std::map<std::string, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // BeginMake calls of all jobs so far: numbers a make uniquely, even across
  // an entry removed and made again.
  uint64_t makes_begun_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_JOB_SECRETS_H_
