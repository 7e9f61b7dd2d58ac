// Pipeline exactness (issue 35): a model cut into P stages, each stage on
// its own thread with its own PipelineStage, gives the gradients of the
// uncut model on the whole batch -- GPipe and 1F1B, P = 2 and 3, M from 1
// to more than P, a last micro-batch smaller than the others, float32 to
// 1e-5 and float64 to 1e-12.
#include "worker/pipeline_stage.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include <thread>

#include "pipeline/stage_cut.h"

namespace pstrain {
namespace {

struct Model {
  std::vector<torch::nn::Linear> layers;
  Model(const std::vector<int64_t>& widths, at::ScalarType dtype) {
    torch::manual_seed(3);
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.emplace_back(widths[i], widths[i + 1]);
      layers.back()->to(dtype);
    }
  }
  // Layers [begin, end), tanh after each but the model's last.
  at::Tensor Run(const at::Tensor& x, size_t begin, size_t end) {
    at::Tensor h = x;
    for (size_t i = begin; i < end; ++i) {
      h = layers[i]->forward(h);
      if (i + 1 < layers.size()) h = at::tanh(h);
    }
    return h;
  }
  std::vector<at::Tensor> Grads() {
    std::vector<at::Tensor> g;
    for (auto& l : layers) {
      for (auto& p : l->parameters()) {
        g.push_back(p.grad().clone());
        p.mutable_grad().zero_();
      }
    }
    return g;
  }
};

at::Tensor Loss(const at::Tensor& out, const at::Tensor& labels) { return at::cross_entropy_loss(out, labels); }

// How the stages' messages travel.
enum class Transport { kInProcess, kGloo };

void CheckExact(PipelineSchedule schedule, int stages, int micro, int64_t batch, at::ScalarType dtype, double tol,
                Transport transport = Transport::kInProcess) {
  SCOPED_TRACE(::testing::Message() << (schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b") << " P " << stages
                                    << " M " << micro << " batch " << batch
                                    << (transport == Transport::kGloo ? " gloo" : ""));
  Model model({6, 12, 10, 8, 4}, dtype);
  at::manual_seed(11);
  const at::Tensor x = at::randn({batch, 6}, at::TensorOptions().dtype(dtype));
  const at::Tensor y = at::randint(0, 4, {batch}, at::kLong);
  // The uncut model on the whole batch.
  Loss(model.Run(x, 0, model.layers.size()), y).backward();
  const std::vector<at::Tensor> want = model.Grads();
  // Stages by parameter count; micro-batches as torch.split cuts them.
  std::vector<double> costs;
  for (auto& l : model.layers) costs.push_back(static_cast<double>(l->weight.numel() + l->bias.numel()));
  auto first = BalancedCut(costs, stages);
  ASSERT_TRUE(first.ok()) << first.status();
  first->push_back(static_cast<int>(model.layers.size()));
  const int64_t per = (batch + micro - 1) / micro;
  std::vector<at::Tensor> inputs = x.split(per), targets = y.split(per);
  ASSERT_EQ(static_cast<int>(inputs.size()), micro) << "choose a batch that makes M micro-batches";
  std::vector<int64_t> sizes;
  for (const at::Tensor& t : inputs) sizes.push_back(t.size(0));
  InProcessStageLinks links(stages, absl::Seconds(30));
  static int group = 0;
  const std::string prefix = "pipeline-" + std::to_string(group++);
  auto store = NewInMemoryStore();
  std::vector<absl::StatusOr<double>> results(stages, 0.0);
  std::vector<int> peaks(stages);
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      PipelineStageOptions o;
      o.schedule = schedule;
      o.stages = stages;
      o.stage = s;
      const size_t begin = (*first)[s], end = (*first)[s + 1];
      o.forward = [&model, begin, end](const at::Tensor& h) { return model.Run(h, begin, end); };
      o.loss = Loss;
      std::unique_ptr<Collective> collective;
      std::unique_ptr<StageLink> gloo;
      StageLink* link = links.link(s);
      if (transport == Transport::kGloo) {
        CollectiveOptions co;
        co.rank = s;
        co.size = stages;
        co.store = store;
        co.prefix = prefix;
        co.hostname = "127.0.0.1";
        co.timeout = absl::Seconds(30);
        auto c = CreateCollective(Collective::Backend::kGloo, co);
        if (!c.ok()) {
          results[s] = c.status();
          return;
        }
        collective = std::move(*c);
        std::vector<int> ranks(stages);
        for (int r = 0; r < stages; ++r) ranks[r] = r;
        gloo = std::make_unique<CollectiveStageLink>(collective.get(), ranks);
        link = gloo.get();
      }
      PipelineStage stage(o, link);
      results[s] = stage.Step(sizes, s == 0 ? inputs : std::vector<at::Tensor>{},
                              s == stages - 1 ? targets : std::vector<at::Tensor>{});
      peaks[s] = stage.peak_activations();
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < stages; ++s) ASSERT_TRUE(results[s].ok()) << "stage " << s << ": " << results[s].status();
  const std::vector<at::Tensor> got = model.Grads();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], want[i], tol, tol)) << "parameter " << i << ": max difference "
                                                         << (got[i] - want[i]).abs().max().item<double>();
  }
  for (int s = 0; s < stages; ++s) {
    EXPECT_EQ(peaks[s], schedule == PipelineSchedule::kGPipe ? micro : std::min(stages - s, micro)) << "stage " << s;
  }
}

TEST(PipelineStageTest, GradientsEqualTheUncutModelsInFloat32) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages : {2, 3}) {
      // M = 1, M < P, M = P, M > P with a smaller last micro-batch (10 = 4 + 4 + 2; 11 = 3 * 3 + 2).
      CheckExact(schedule, stages, 1, 8, at::kFloat, 1e-5);
      CheckExact(schedule, stages, 2, 8, at::kFloat, 1e-5);
      CheckExact(schedule, stages, 3, 10, at::kFloat, 1e-5);
      CheckExact(schedule, stages, 4, 11, at::kFloat, 1e-5);
      CheckExact(schedule, stages, 8, 16, at::kFloat, 1e-5);
    }
  }
}

TEST(PipelineStageTest, GradientsEqualTheUncutModelsInFloat64) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    CheckExact(schedule, 3, 4, 11, at::kDouble, 1e-12);
  }
}

// The same over Gloo's point-to-point between three ranks: every message
// carries its shape (the micro-batches differ in size).
TEST(PipelineStageTest, GlooCarriesTheStagesMessagesExactly) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    CheckExact(schedule, 3, 4, 11, at::kFloat, 1e-5, Transport::kGloo);
    CheckExact(schedule, 2, 1, 5, at::kDouble, 1e-12, Transport::kGloo);
  }
}

// A peer's header is input like any other: one that claims 1000 dims, an
// unknown or unsent dtype, or more bytes than the link's bound (here 1 MiB;
// 2^62 x 2^62 overflows an int64) is DATA_LOSS, never an allocation of what
// it says.
TEST(PipelineStageTest, AMalformedStageHeaderIsRefused) {
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Collective>> group(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CollectiveOptions co;
      co.rank = r;
      co.size = 2;
      co.store = store;
      co.prefix = "malformed";
      co.hostname = "127.0.0.1";
      co.timeout = absl::Seconds(30);
      auto c = CreateCollective(Collective::Backend::kGloo, co);
      ASSERT_TRUE(c.ok()) << c.status();
      group[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(group[0] && group[1]);
  CollectiveStageLink receiver(group[1].get(), {0, 1}, /*max_bytes=*/1 << 20);
  const int64_t kFloat = static_cast<int64_t>(at::kFloat), kQInt8 = static_cast<int64_t>(at::kQInt8);
  const int64_t big = int64_t{1} << 62;
  for (const std::vector<int64_t>& bad :
       {std::vector<int64_t>{6, 1000}, std::vector<int64_t>{999, 1, 4}, std::vector<int64_t>{kQInt8, 1, 4},
        std::vector<int64_t>{kFloat, 2, 1024, 257}, std::vector<int64_t>{kFloat, 2, big, big}}) {
    at::Tensor header = at::zeros({10}, at::kLong);
    for (size_t i = 0; i < bad.size(); ++i) header[static_cast<int64_t>(i)] = bad[i];
    auto sent = group[0]->Send(header, 1, 2 * 7);  // the header of message tag 7
    auto got = receiver.Recv(0, 7);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_TRUE(sent->Wait().ok());
  }
  EXPECT_EQ(receiver.Recv(5, 1).status().code(), absl::StatusCode::kInvalidArgument);  // no stage 5
}

TEST(PipelineStageTest, ALostNeighbourFailsTheStepInsteadOfHangingIt) {
  InProcessStageLinks links(2, absl::Milliseconds(200));
  PipelineStageOptions o;
  o.stages = 2;
  o.stage = 1;
  o.forward = [](const at::Tensor& h) { return h * 2; };
  o.loss = [](const at::Tensor& out, const at::Tensor&) { return out.sum(); };
  PipelineStage stage(o, links.link(1));
  auto r = stage.Step({1, 1}, {}, {at::zeros({1}), at::zeros({1})});  // stage 0 never sends
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_EQ(stage.Step({1}, {}, {}).status().code(), absl::StatusCode::kInvalidArgument);  // no targets
}

}  // namespace
}  // namespace pstrain
