#include "worker/step_schedule.h"

#include <gtest/gtest.h>

namespace pstrain {
namespace {

JobSpec Spec() {
  JobSpec spec;
  spec.batch_size = 16;
  spec.accumulate_steps = 2;
  spec.epochs = 3;
  return spec;
}

// 50 examples: micro-batches 16, 16, 16, 2; steps of two micro-batches.
TEST(StepSchedule, CountsMicroBatchesAndSteps) {
  const StepSchedule s = MakeStepSchedule(Spec(), 50, 0, 0, 0, -1);
  EXPECT_EQ(s.micro_per_epoch, 4);
  EXPECT_EQ(s.steps_per_epoch, 2);
  EXPECT_EQ(s.total_steps, 6);
  EXPECT_EQ(s.start_step, 0);
  EXPECT_EQ(s.start_epoch, 0);
  EXPECT_EQ(s.start_epoch_step, 0);
  JobSpec capped = Spec();
  capped.max_steps = 5;
  EXPECT_EQ(MakeStepSchedule(capped, 50, 0, 0, 0, -1).total_steps, 5);
}

TEST(StepSchedule, ResumesAtTheCheckpointsPlace) {
  const StepSchedule s = MakeStepSchedule(Spec(), 50, 3, 1, 1, -1);
  EXPECT_EQ(s.start_step, 3);
  EXPECT_EQ(s.start_epoch, 1);
  EXPECT_EQ(s.start_epoch_step, 1);
}

// A replacement continues the rank where it got: one step past the
// checkpoint's place (epoch 1, its last step) is epoch 2's first step.
TEST(StepSchedule, AReplacementContinuesWhereTheRankGot) {
  const StepSchedule s = MakeStepSchedule(Spec(), 50, 3, 1, 1, /*rejoin_step=*/4);
  EXPECT_EQ(s.start_step, 4);
  EXPECT_EQ(s.start_epoch, 2);
  EXPECT_EQ(s.start_epoch_step, 0);
}

}  // namespace
}  // namespace pstrain
