// JobTelemetry: what the coordinator records of a job's training for people
// to look at -- TensorBoard event files and the curves the web dashboard
// draws.
//
// Why the coordinator writes the event files: it is the one process that
// hears every rank (progress, evaluations) and outlives the attempts, so a
// job has one writer and one run per attempt
// (<job dir>/tensorboard/attempt-<n>/: a restart is a new run on the same
// charts), nothing is written by the workers' training loops, and the files
// land on the shared volume next to the checkpoints. The shards' own view
// of their latency is in Prometheus (pstrain_ps_*); the event files carry
// rank 0's client-side view of each shard (what training waits for).
//
// Per progress event of rank r: rank_<r>/{loss, samples_per_s,
// step_time_ms, exchange_wait_ms, data_wait_ms}; for rank 0 also the job's
// train/{loss (mean over ranks), samples_per_s (sum), learning_rate,
// step_time_ms, exchange_wait_ms, data_wait_ms, grad_norm} and
// shard_<i>/{call_ms, bytes_per_s}; per evaluation eval/{accuracy,
// test_loss} and, for a click model (dlrm), eval/{auc, log_loss}; the spec
// as text (job/spec).
//
// Calls only enqueue (the writers' threads do the disk work), so the
// coordinator may call under its own lock. Thread-safe.
#ifndef PSTRAIN_SERVER_COORDINATOR_JOB_TELEMETRY_H_
#define PSTRAIN_SERVER_COORDINATOR_JOB_TELEMETRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"
#include "tensorboard/event_writer.h"

namespace pstrain {

struct TelemetryOptions {
  bool tensorboard = true;  // write event files
  absl::Duration flush_interval = absl::Seconds(2);
  size_t max_queued = 10000;  // per writer; beyond, events are dropped (counted)
  size_t max_points = 1000;   // per curve kept for the dashboard (then thinned)
  size_t max_jobs = 200;      // jobs whose curves are kept (the newest)
};

struct CurvePoint {
  int64_t step = 0;
  double wall_s = 0;  // Unix seconds
  double value = 0;
};

// The dashboard's curves of one job (all attempts, in time order).
struct JobCurves {
  std::vector<CurvePoint> loss, samples_per_s, accuracy, test_loss;
  std::vector<CurvePoint> auc;  // click models' evaluations only
  // Each shard's calls in rank 0's latest progress window.
  std::map<int, ShardCalls> shards;
};

class JobTelemetry {
 public:
  explicit JobTelemetry(TelemetryOptions options);
  ~JobTelemetry();

  // An attempt of `job` starts (a new event file); the previous one, if
  // any, is closed.
  void StartAttempt(const std::string& job, uint64_t attempt, const std::string& job_dir,
                    const std::string& spec_yaml);
  // The attempt ended (finished, failed, requeued): its file is closed.
  void EndAttempt(const std::string& job);
  // A progress event of `rank`, after it was merged into `status`.
  void Progress(const std::string& job, int rank, const WorkerEvent::Progress& p, const JobStatus& status);
  // An evaluation, at training step `step`.
  void Eval(const std::string& job, const WorkerEvent::Eval& e, int64_t step);

  // Copies of the job's curves (empty when unknown).
  JobCurves Curves(const std::string& job) const;
  // Rank 0's pace over the last minute of its reports: its latest step and
  // steps per second (nullopt until two reports).
  struct Pace {
    int64_t step = 0;
    double steps_per_s = 0;
  };
  std::optional<Pace> RecentPace(const std::string& job) const;
  uint64_t dropped() const;

 private:
  struct JobData {
    std::unique_ptr<EventWriter> writer;
    JobCurves curves;
    uint64_t touched = 0;  // for choosing which job to forget
  };
  JobData& Data(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Retire(std::unique_ptr<EventWriter> writer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Append(std::vector<CurvePoint>& curve, CurvePoint p) const;

  const TelemetryOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, JobData> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  // Closed writers finishing their last writes (joined when done).
  std::vector<std::unique_ptr<EventWriter>> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t retired_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_JOB_TELEMETRY_H_
