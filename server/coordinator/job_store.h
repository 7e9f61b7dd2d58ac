// JobStore: the coordinator's durable record of its jobs, in SQLite. A job
// is one row: id, submission order, spec, output dir and its JobStatus (a
// serialized proto). Each write is a transaction; the database runs in WAL
// mode with synchronous=FULL, so a job the coordinator acknowledged survives
// a crash of the coordinator or the machine.
//
// Thread-safe: one mutex around the connection (SQLite serializes its own
// calls, but a transaction here spans several).
#ifndef PSTRAIN_SERVER_COORDINATOR_JOB_STORE_H_
#define PSTRAIN_SERVER_COORDINATOR_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/control.pb.h"

struct sqlite3;

namespace pstrain {

struct StoredJob {
  std::string id;
  int64_t seq = 0;  // submission order
  std::string spec_yaml;
  std::string output_dir;
  JobStatus status;
};

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" for tests.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // Stores a new job; assigns its id ("job-000042") into the status.
  absl::StatusOr<StoredJob> Create(const std::string& spec_yaml, const std::string& output_dir,
                                   JobStatus status);
  absl::Status Update(const JobStatus& status);
  absl::StatusOr<StoredJob> Get(const std::string& id);
  // Removes the jobs (ended ones past the coordinator's retention) in one
  // transaction; ids not in the store are skipped.
  absl::Status Delete(const std::vector<std::string>& ids);
  // Every job, in submission order.
  absl::StatusOr<std::vector<StoredJob>> List();
  // Counts the lives of the coordinator over this store: 1 the first time,
  // then one more on each call, durably (committed before it returns), so a
  // number drawn from it is never drawn again after a crash.
  absl::StatusOr<int64_t> NextIncarnation();

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_JOB_STORE_H_
