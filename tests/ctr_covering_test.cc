// A SYNC CTR worker covering a vacant rank's batch with clip_grad_norm
// (worker/ctr_clip.h): each batch is clipped on its own, as the worker
// whose batch it is would have clipped it, before the sum is pushed. Four
// steps of a 2-rank job, once trained by both ranks and once with rank 1
// leaving after step 1 (rank 0 covers its batches of steps 2 and 3), must
// push the same rows' gradients and end with the same dense values (up to
// float reassociation; the rows are held at their first values, see
// SummingRows).
// Clipping binds: clipping the sum instead would differ by far more.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tests/ctr_trainer_testing.h"
#include "tests/trainer_testing.h"
#include "worker/ctr_trainer.h"
#include "worker/sparse_embeddings.h"

namespace pstrain {
namespace {

// Looks rows up in `rows` and sums the gradients pushed per (step, table,
// id) over every rank's Update, without applying them: the rows keep their
// first values, so what a rank looks up does not depend on whether the
// other rank pushed first (the local rows have no SYNC step of their own).
class SummingRows : public ForwardingRows {
 public:
  explicit SummingRows(EmbeddingRows* rows) : ForwardingRows(rows) {}
  absl::Status Update(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                      const std::vector<const float*>& grads) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t t = 0; t < unique_ids.size(); ++t) {
      const size_t d = static_cast<size_t>(dim(t));
      for (size_t i = 0; i < unique_ids[t].size(); ++i) {
        std::vector<double>& sum = sums[{step, static_cast<int64_t>(t), unique_ids[t][i]}];
        sum.resize(d, 0.0);
        for (size_t j = 0; j < d; ++j) sum[j] += grads[t][i * d + j];
      }
    }
    return absl::OkStatus();
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<double>> sums;

 private:
  std::mutex mu_;
};

struct Trained {
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<double>> sums;
  int64_t samples = 0;
  std::vector<double> norms;  // rank 0's, per step
};

// `spec` trained by its 2 ranks; with `leave`, rank 1 trains steps 0 and
// 1 only and is made vacant once its step-1 push is in (rank 0 waits at its
// step-1 boundary): rank 0 covers it from step 2.
Trained Train(const JobSpec& spec, bool leave) {
  Shards shards(spec.shards);
  absl::Status seats;
  auto local = LocalEmbeddingRows::Create(spec.embeddings.tables);
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return {};
  SummingRows rows(local->get());
  Trained run;
  std::vector<absl::StatusOr<TrainResult>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TrainerOptions o = Options(spec, r);
      o.shards = shards.ptrs;
      if (leave && r == 1) o.spec.max_steps = 2;
      if (leave && r == 0) {
        o.at_step_boundary = [&](const StepBoundary& at) {
          if (at.step != 1) return;
          seats = AwaitPushes(shards, spec.name, 3);  // step 0: two arrivals per chunk, step 1: rank 1's
          if (seats.ok()) seats = SetSeats(shards, spec.name, {true, false});
        };
      }
      if (r == 0) {
        o.emit = [&](const WorkerEvent& e) {
          if (e.has_progress() && e.progress().has_grad_norm()) run.norms.push_back(e.progress().grad_norm());
        };
      }
      results[r] = RunCtrTrainer(o, &rows);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(seats.ok()) << seats;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    if (!results[r].ok()) return {};
    run.samples += results[r]->samples;
  }
  run.params = results[0]->parameters;
  run.sums = std::move(rows.sums);
  return run;
}

TEST(CtrCoveringTest, ACoveringWorkerClipsEachRanksBatchOnItsOwn) {
  at::set_num_threads(1);
  JobSpec spec = CtrSpec("cover-clip", 2);
  spec.consistency = SYNC;
  spec.min_workers = 1;
  spec.optimizer.set_kind(OptimizerConfig::SGD);
  spec.optimizer.set_lr(0.5);
  spec.max_steps = 4;
  // Rank 0 pushes step 1 only after all of rank 1's step-1 pushes arrived
  // (see trainer_test's ACoveringWorkerClipsEachRanksBatchOnItsOwn).
  spec.requests_in_flight = 0;
  spec.log_every_steps = 1;
  spec.clip_grad_norm = 0.05;
  const Trained both = Train(spec, /*leave=*/false);
  spec.name = "cover-clip-alone";
  const Trained alone = Train(spec, /*leave=*/true);
  ASSERT_FALSE(both.params.empty());
  ASSERT_FALSE(alone.params.empty());
  EXPECT_EQ(alone.samples, both.samples) << "rank 0 trained its batches and rank 1's";
  ASSERT_FALSE(alone.norms.empty());
  EXPECT_GT(*std::min_element(alone.norms.begin(), alone.norms.end()), 4 * spec.clip_grad_norm)
      << "clipping did not bind";
  ASSERT_EQ(alone.params.size(), both.params.size());
  for (size_t i = 0; i < both.params.size(); ++i) {
    const at::Tensor& want = both.params[i].second;
    const at::Tensor& got = alone.params[i].second;
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-6))
        << both.params[i].first << " differs by " << got.sub(want).abs().max().item<double>();
  }
  ASSERT_EQ(alone.sums.size(), both.sums.size());
  for (const auto& [row, want] : both.sums) {
    auto it = alone.sums.find(row);
    ASSERT_NE(it, alone.sums.end()) << "step " << std::get<0>(row) << " table " << std::get<1>(row);
    for (size_t d = 0; d < want.size(); ++d) {
      ASSERT_NEAR(it->second[d], want[d], 1e-7 + 1e-4 * std::fabs(want[d])) << "table " << std::get<1>(row);
    }
  }
}

}  // namespace
}  // namespace pstrain
