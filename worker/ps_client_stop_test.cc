// A PsClient call failing over on a lost shard ends when the job stops:
// a cancelled job's worker must not wait out the call's timeout (120 s in
// a job) for a routing that will never come.
#include "worker/ps_client.h"

#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "table/shard_store.h"

namespace pstrain {
namespace {

// A shard that answers every pull and push-pull UNAVAILABLE (a lost one).
class LostShard : public ShardStore {
 public:
  LostShard() : ShardStore(ShardStoreOptions()) {}
  void PullAsync(const PullRequest&, PullResponse*, std::vector<TensorBuffer>*, const CallOptions&,
                 StatusCallback done) override {
    done(absl::UnavailableError("connection refused"));
  }
  void PushPullAsync(const PushPullRequest&, std::vector<TensorBuffer>, PushPullResponse*,
                     std::vector<TensorBuffer>*, const CallOptions&, StatusCallback done) override {
    done(absl::UnavailableError("connection refused"));
  }
};

class PsClientStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PsClientOptions o;
    o.job = "job";
    // Replicated: a failed call waits for the coordinator's next routing,
    // which never comes here.
    o.plan = *MakePartitionPlan({{"w", {4}, DT_FLOAT32}}, 2, 1 << 20, /*replicas=*/1);
    o.shard_targets = {"shard-0", "shard-1"};
    o.next_routing = [](uint64_t, absl::Duration wait) -> absl::StatusOr<Routing> {
      absl::SleepFor(std::min(wait, absl::Milliseconds(50)));
      return absl::NotFoundError("no newer routing");
    };
    o.timeout = absl::Seconds(30);
    o.stop = &stop_;
    ps_ = *PsClient::Create(o, {&shards_[0], &shards_[1]});
    stopper_ = std::thread([this] {
      absl::SleepFor(absl::Milliseconds(300));
      stop_ = true;
    });
  }
  void TearDown() override { stopper_.join(); }

  LostShard shards_[2];
  std::atomic<bool> stop_{false};
  std::unique_ptr<PsClient> ps_;
  std::thread stopper_;
  at::Tensor w_ = at::zeros({4});
};

TEST_F(PsClientStopTest, APullFailingOverEndsCancelledWhenTheJobStops) {
  const absl::Time start = absl::Now();
  absl::Status s = ps_->Pull({w_});
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(PsClientStopTest, AnAsyncPushPullFailingOverEndsCancelledWhenTheJobStops) {
  const absl::Time start = absl::Now();
  at::Tensor grad = at::zeros({4});
  std::promise<absl::Status> done;
  ps_->PushPullAsync(0, {0}, {grad}, {w_}, 0, [&](absl::Status s) { done.set_value(s); });
  absl::Status s = done.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace pstrain
