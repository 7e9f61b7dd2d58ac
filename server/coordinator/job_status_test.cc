// How a job's status folds its ranks' progress events together.
#include "server/coordinator/job_status.h"

#include <gtest/gtest.h>

namespace pstrain {
namespace {

WorkerEvent::Progress Progress(int64_t step, double loss, double rate) {
  WorkerEvent::Progress p;
  p.set_epoch(1);
  p.set_epochs(1);
  p.set_step(step);
  p.set_steps(100);
  p.set_loss(loss);
  p.set_samples_per_s(rate);
  return p;
}

TEST(JobStatusMerge, RanksRatesAddUpAndTheirLossesAverage) {
  JobStatus st;
  MergeProgress(st, 2, 0, Progress(20, 1.0, 100));
  MergeProgress(st, 2, 1, Progress(19, 3.0, 110));
  EXPECT_EQ(st.step(), 19);  // the slowest rank's
  EXPECT_DOUBLE_EQ(st.loss(), 2.0);
  EXPECT_DOUBLE_EQ(st.samples_per_s(), 210);
}

// Two replicas of a 2-stage pipeline: a replica's samples pass both of its
// stages (counted once, at the first), and only the last stage has a loss.
TEST(JobStatusMerge, APipelinesSamplesCountOnceAndItsLossIsTheLastStages) {
  JobStatus st;
  for (int rank = 0; rank < 4; ++rank) {
    const int stage = rank % 2;
    WorkerEvent::Progress p = Progress(10 + rank, stage == 1 ? 0.5 + rank : 0.0, 100);
    p.set_stage(stage);
    p.set_stages(2);
    p.set_bubble(stage == 0 ? 0.25 : 0.5);
    MergeProgress(st, 4, rank, p);
  }
  EXPECT_EQ(st.step(), 10);
  EXPECT_DOUBLE_EQ(st.samples_per_s(), 200);          // ranks 0 and 2
  EXPECT_DOUBLE_EQ(st.loss(), (1.5 + 3.5) / 2);       // ranks 1 and 3
  ASSERT_EQ(st.workers_size(), 4);
  EXPECT_EQ(st.workers(3).stage(), 1);
  EXPECT_EQ(st.workers(3).stages(), 2);
  EXPECT_DOUBLE_EQ(st.workers(2).bubble(), 0.25);
}

}  // namespace
}  // namespace pstrain
