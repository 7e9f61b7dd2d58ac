#include "worker/step_schedule.h"

#include <algorithm>

namespace pstrain {

StepSchedule MakeStepSchedule(const JobSpec& spec, int64_t per_rank, int64_t start_step, int start_epoch,
                              int64_t start_epoch_step, int64_t rejoin_step) {
  StepSchedule s;
  s.micro_per_epoch = (per_rank + spec.batch_size - 1) / spec.batch_size;
  s.steps_per_epoch = (s.micro_per_epoch + spec.accumulate_steps - 1) / spec.accumulate_steps;
  s.total_steps = s.steps_per_epoch * spec.epochs;
  if (spec.max_steps > 0) s.total_steps = std::min<int64_t>(s.total_steps, spec.max_steps);
  s.start_step = start_step;
  s.start_epoch = start_epoch;
  s.start_epoch_step = start_epoch_step;
  if (rejoin_step >= start_step) {
    const int64_t index = start_epoch * s.steps_per_epoch + start_epoch_step + (rejoin_step - start_step);
    s.start_epoch = static_cast<int>(index / s.steps_per_epoch);
    s.start_epoch_step = index % s.steps_per_epoch;
    s.start_step = rejoin_step;
  }
  return s;
}

}  // namespace pstrain
