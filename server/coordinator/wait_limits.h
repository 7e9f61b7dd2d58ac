// WaitLimits: how many calls may hold a server thread while they wait.
//
// The coordinator's gRPC server is synchronous: every call in progress holds
// one of its threads, and the pool is bounded (GrpcServerOptions::
// max_threads, --grpc_max_threads). Most calls return at once; the ones
// that wait -- a WatchJob stream, a KvGet or GetAssignment with a wait --
// hold their thread for as long as they wait. Counting them here keeps
// their number below the pool's, so that short calls (SubmitJob, ListJobs,
// heartbeats) always find a thread: globally (max_waiting_calls, every
// caller, cluster members included) and, for watches, per user
// (max_watches_per_user). A call that finds no slot is refused at once
// (RESOURCE_EXHAUSTED, naming the limit and its flag), never queued.
//
// Thread-safe. A Slot gives its place back when destroyed; it must not
// outlive the WaitLimits that gave it.
#ifndef PSTRAIN_SERVER_COORDINATOR_WAIT_LIMITS_H_
#define PSTRAIN_SERVER_COORDINATOR_WAIT_LIMITS_H_

#include <cstddef>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

struct WaitLimitsOptions {
  // 0: no bound.
  size_t max_waiting_calls = 0;
  size_t max_watches_per_user = 0;
};

class WaitLimits {
 public:
  explicit WaitLimits(WaitLimitsOptions options) : options_(options) {}
  WaitLimits(const WaitLimits&) = delete;
  WaitLimits& operator=(const WaitLimits&) = delete;

  // One place taken; given back by the destructor (or by a move-assign).
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }

   private:
    friend class WaitLimits;
    Slot(WaitLimits* limits, std::string user, bool watch) : limits_(limits), user_(std::move(user)), watch_(watch) {}
    void Release();

    WaitLimits* limits_ = nullptr;
    std::string user_;
    bool watch_ = false;
  };

  // A watch (WatchJob) by `user` ("" is the anonymous caller of a
  // coordinator without authentication: one user like any other).
  absl::StatusOr<Slot> AcquireWatch(const std::string& user);
  // Another waiting call; `what` names it in the refusal ("KvGet wait").
  absl::StatusOr<Slot> AcquireWait(absl::string_view what);

  size_t waiting() const;
  size_t watches(const std::string& user) const;

 private:
  void Release(const std::string& user, bool watch);

  const WaitLimitsOptions options_;
  mutable absl::Mutex mu_;
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, size_t> watches_ ABSL_GUARDED_BY(mu_);  // only users with some open
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_WAIT_LIMITS_H_
