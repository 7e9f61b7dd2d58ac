// A job's status record (control.proto JobStatus): the rules for changing
// it, apart from who changes it and when. No locks, no clock.
#ifndef PSTRAIN_SERVER_COORDINATOR_JOB_STATUS_H_
#define PSTRAIN_SERVER_COORDINATOR_JOB_STATUS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"
#include "proto/events.pb.h"

namespace pstrain {

const char* JobStateName(JobState state);
bool IsTerminal(JobState state);

// Sets the state and records the transition as a condition. The first
// condition (Submitted) and the newest `max_conditions - 1` are kept.
void AddCondition(JobStatus& status, JobState state, const std::string& reason, const std::string& message,
                  absl::Time now, size_t max_conditions);

// One worker's progress report. The job is as far as its slowest reporting
// worker; rates add up; the loss is their mean. In a pipelined job only the
// first stages' rates add up and only the last stages' losses count.
void MergeProgress(JobStatus& status, int workers, int rank, const WorkerEvent::Progress& progress);

// An evaluation; RESOURCE_EXHAUSTED beyond 10000 of them.
absl::Status AddEval(JobStatus& status, const WorkerEvent::Eval& eval);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_JOB_STATUS_H_
