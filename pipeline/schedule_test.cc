#include "pipeline/schedule.h"

#include <gtest/gtest.h>

#include <string>

namespace pstrain {
namespace {

std::vector<std::vector<PipelineAction>> AllStages(PipelineSchedule schedule, int stages, int micro_batches) {
  std::vector<std::vector<PipelineAction>> out;
  for (int s = 0; s < stages; ++s) {
    auto a = StageActions(schedule, stages, s, micro_batches);
    EXPECT_TRUE(a.ok()) << a.status();
    out.push_back(a.ok() ? *a : std::vector<PipelineAction>{});
  }
  return out;
}

std::string Text(const std::vector<PipelineAction>& actions) {
  std::string s;
  for (const PipelineAction& a : actions) {
    s += (a.kind == PipelineAction::kForward ? "F" : "B") + std::to_string(a.micro_batch) + " ";
  }
  return s;
}

TEST(PipelineScheduleTest, OneFOneBWarmsUpAlternatesAndDrains) {
  const auto a = AllStages(PipelineSchedule::k1F1B, 3, 4);
  EXPECT_EQ(Text(a[0]), "F0 F1 F2 B0 F3 B1 B2 B3 ");
  EXPECT_EQ(Text(a[1]), "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(Text(a[2]), "F0 B0 F1 B1 F2 B2 F3 B3 ");
  const auto g = AllStages(PipelineSchedule::kGPipe, 2, 3);
  EXPECT_EQ(Text(g[0]), "F0 F1 F2 B2 B1 B0 ");
}

// Every schedule, P up to 6, M from 1 (fewer micro-batches than stages)
// to 4P: no deadlock, every micro-batch once each way, 1F1B holding at most
// min(P - s, M) activations where GPipe holds M, and the bubble of theory
// when forward and backward times are even (backward twice the forward).
TEST(PipelineScheduleTest, EverySizeRunsWithTheTheoreticalBubbleAndBoundedActivations) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int m = 1; m <= 4 * stages; ++m) {
        SCOPED_TRACE(::testing::Message() << (schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b") << " P "
                                          << stages << " M " << m);
        const auto actions = AllStages(schedule, stages, m);
        for (const auto& a : actions) ASSERT_EQ(a.size(), static_cast<size_t>(2 * m));
        auto sim = SimulatePipeline(actions, m, std::vector<double>(stages, 1.0), std::vector<double>(stages, 2.0));
        ASSERT_TRUE(sim.ok()) << sim.status();
        for (int s = 0; s < stages; ++s) {
          EXPECT_NEAR(sim->bubble[s], TheoreticalBubble(stages, m), 1e-9) << "stage " << s;
          const int bound = schedule == PipelineSchedule::kGPipe ? m : std::min(stages - s, m);
          EXPECT_EQ(sim->peak_activations[s], bound) << "stage " << s;
        }
        EXPECT_DOUBLE_EQ(sim->step_time, 3.0 * (m + stages - 1));
      }
    }
  }
}

TEST(PipelineScheduleTest, TheSimulatorFindsDeadlocksAndBrokenLists) {
  // Stage 0 waits for stage 1's backward of 1 while stage 1 waits for
  // stage 0's forward of 1 (stage 0 runs B1 before F1... of its own: broken).
  std::vector<std::vector<PipelineAction>> broken = {
      {{PipelineAction::kForward, 0}, {PipelineAction::kBackward, 1}, {PipelineAction::kForward, 1},
       {PipelineAction::kBackward, 0}},
      {{PipelineAction::kForward, 0}, {PipelineAction::kBackward, 0}, {PipelineAction::kForward, 1},
       {PipelineAction::kBackward, 1}}};
  EXPECT_EQ(SimulatePipeline(broken, 2, {1, 1}, {1, 1}).status().code(), absl::StatusCode::kFailedPrecondition);
  // A real deadlock: stage 1 wants micro-batch 1 first, stage 0 will only
  // send it after stage 1's backward of 0.
  std::vector<std::vector<PipelineAction>> stuck = {
      {{PipelineAction::kForward, 0}, {PipelineAction::kBackward, 0}, {PipelineAction::kForward, 1},
       {PipelineAction::kBackward, 1}},
      {{PipelineAction::kForward, 1}, {PipelineAction::kForward, 0}, {PipelineAction::kBackward, 0},
       {PipelineAction::kBackward, 1}}};
  auto s = SimulatePipeline(stuck, 2, {1, 1}, {1, 1});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("deadlocks"), std::string::npos) << s.status();
  EXPECT_EQ(StageActions(PipelineSchedule::k1F1B, 0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StageActions(PipelineSchedule::k1F1B, 2, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StageActions(PipelineSchedule::kGPipe, 2, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
