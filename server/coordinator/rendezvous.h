// Rendezvous: a small key-value store per job attempt, for workers to find
// each other (the all-reduce bootstrap) and for rank 0 to report a
// checkpoint it wrote. Bounded in keys and bytes. Thread-safe, with a lock
// of its own: a blocked Get never holds up the coordinator.
//
// A job's table exists for one attempt at a time: Open() starts it empty,
// Close() ends it. A request for another attempt, or for an ended one, is
// refused (ABORTED), so a member of an earlier run cannot leave keys for
// the next.
#ifndef PSTRAIN_SERVER_COORDINATOR_RENDEZVOUS_H_
#define PSTRAIN_SERVER_COORDINATOR_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pstrain {

inline constexpr size_t kMaxKvKeyBytes = 512;

struct RendezvousLimits {
  size_t max_keys = 10000;  // per job
  size_t max_value_bytes = 1 << 20;
  size_t max_bytes = 64 << 20;  // per job, keys and values
};

class Rendezvous {
 public:
  explicit Rendezvous(RendezvousLimits limits) : limits_(limits) {}

  // The job's table for `attempt`, empty (what an earlier attempt left goes).
  void Open(const std::string& job, uint64_t attempt);
  // The attempt ended: its keys go, its requests are refused.
  void Close(const std::string& job);
  // Wakes every Get; later ones fail UNAVAILABLE.
  void Shutdown();

  absl::Status Set(const std::string& job, uint64_t attempt, const std::string& key, const std::string& value);
  // NOT_FOUND when the key is still missing at the deadline (real time).
  absl::StatusOr<std::string> Get(const std::string& job, uint64_t attempt, const std::string& key,
                                  absl::Time deadline);
  // OUT_OF_RANGE when the sum would overflow.
  absl::StatusOr<int64_t> Add(const std::string& job, uint64_t attempt, const std::string& key, int64_t delta);

 private:
  struct Table {
    uint64_t attempt = 0;
    bool open = false;
    size_t bytes = 0;  // keys and values
    std::map<std::string, std::string> kv;
  };
  // The open table of that attempt, or why there is none.
  absl::StatusOr<Table*> Access(const std::string& job, uint64_t attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Put(Table& table, const std::string& job, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousLimits limits_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_RENDEZVOUS_H_
