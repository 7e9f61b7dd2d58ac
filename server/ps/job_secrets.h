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
// Thread-safe.
#ifndef PSTRAIN_SERVER_PS_JOB_SECRETS_H_
#define PSTRAIN_SERVER_PS_JOB_SECRETS_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

class JobSecrets {
 public:
  // OK when the job has no recorded secret or `presented` is it.
  absl::Status Check(const std::string& job, absl::string_view presented) const ABSL_LOCKS_EXCLUDED(mu_);
  // After a successful InitTable/LoadTable: records `presented` unless the
  // job has a secret already.
  void Record(const std::string& job, absl::string_view presented) ABSL_LOCKS_EXCLUDED(mu_);
  // After a successful DropTable.
  void Forget(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> secrets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_JOB_SECRETS_H_
