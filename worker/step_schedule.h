// StepSchedule: how one rank's run is laid out in optimizer steps -- an
// epoch's micro-batches and steps, the job's total -- and where a worker
// starts in it: a checkpoint's place, or, taking over a lost worker's rank
// while the job runs, as far beyond that place as the rank has got.
#ifndef PSTRAIN_WORKER_STEP_SCHEDULE_H_
#define PSTRAIN_WORKER_STEP_SCHEDULE_H_

#include <cstdint>

#include "common/job_spec.h"

namespace pstrain {

struct StepSchedule {
  int64_t micro_per_epoch = 0;  // micro-batches of batch_size (the last may be short)
  int64_t steps_per_epoch = 0;  // accumulate_steps micro-batches each (the last may have fewer)
  int64_t total_steps = 0;      // epochs' worth, at most max_steps
  // The first step to run, and where it is.
  int64_t start_step = 0;
  int start_epoch = 0;
  int64_t start_epoch_step = 0;
};

// `per_rank`: the examples of one rank's slice of an epoch. The start_*
// arguments: the checkpoint's place (zeros for a fresh run); `rejoin_step`:
// the step a replacement continues at, -1 if the worker is none (see
// TrainerOptions).
StepSchedule MakeStepSchedule(const JobSpec& spec, int64_t per_rank, int64_t start_step, int start_epoch,
                              int64_t start_epoch_step, int64_t rejoin_step);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_STEP_SCHEDULE_H_
