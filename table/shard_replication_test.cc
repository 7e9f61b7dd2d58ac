// Replicated tables (shard_store_replication.cc): shards in one process,
// forwarding to each other through ReplicateAsync as pstrain-ps does over
// gRPC. A "lost" shard is shut down and its forwards fail, as a killed
// process's would.
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using testing_util::Floats;
using testing_util::ToFloats;
using testing_util::Within;

// SGD with momentum: the state a promoted backup must continue with.
TableConfig MomentumConfig(Consistency consistency, uint32_t workers) {
  TableConfig c;
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_lr(0.1);
  c.mutable_optimizer()->set_momentum(0.9);
  c.set_consistency(consistency);
  c.set_num_workers(workers);
  return c;
}

// The value and momentum of a chunk, as a shard holds it.
struct ChunkView {
  std::vector<float> value, momentum;
  int64_t optimizer_step = 0;
  bool operator==(const ChunkView& o) const {
    return value == o.value && momentum == o.momentum && optimizer_step == o.optimizer_step;
  }
};

// `n` shards of job "job", each key on shards copies[key] (primary first).
class Ring {
 public:
  Ring(int n, std::map<std::string, std::vector<uint32_t>> copies, TableConfig config)
      : copies_(std::move(copies)), config_(std::move(config)) {
    for (int i = 0; i < n; ++i) {
      routing_.add_targets(absl::StrCat("s", i));
      down_.push_back(false);
      stores_.push_back(NewStore(i));
    }
  }
  ~Ring() {
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < down_.size(); ++i) down_[i] = true;
    }
    stores_.clear();
  }

  ShardStore& store(int i) { return *stores_[i]; }
  const Routing& routing() const { return routing_; }

  // The store a shard's forwards reach.
  std::unique_ptr<ShardStore> NewStore(int i) {
    ShardStoreOptions o = testing_util::Rooted(i, 3);
    o.forward = [this](const std::string& target, const ReplicateRequest& req, const std::vector<TensorBuffer>& t,
                       ReplicateResponse* resp, StatusCallback done) {
      const int to = std::stoi(target.substr(1));
      ShardStore* s = nullptr;
      {
        absl::MutexLock lock(&mu_);
        ++forwards_[to];
        if (!down_[to]) s = stores_[to].get();
      }
      if (s == nullptr) return done(absl::UnavailableError("connection refused"));
      {
        absl::MutexLock lock(&mu_);
        if (held_to_ == to) {  // kept in flight until Release (the caller keeps req, t and resp alive)
          held_.push_back([s, &req, &t, resp, done = std::move(done)]() mutable {
            s->ReplicateAsync(req, t, resp, {}, std::move(done));
          });
          return;
        }
      }
      s->ReplicateAsync(req, t, resp, {}, std::move(done));
    };
    return std::make_unique<ShardStore>(std::move(o));
  }

  absl::Status Init(int shard, std::vector<float> init = {1, 2, 3, 4}) {
    InitTableRequest req;
    req.set_job("job");
    *req.mutable_config() = config_;
    req.set_shard(shard);
    *req.mutable_routing() = routing_;
    std::vector<TensorBuffer> values;
    for (const auto& [key, copies] : copies_) {
      if (std::find(copies.begin(), copies.end(), shard) == copies.end()) continue;
      req.add_keys(key);
      req.add_copies()->mutable_shards()->Add(copies.begin(), copies.end());
      values.push_back(Floats(init));
    }
    InitTableResponse resp;
    return WaitFor([&](StatusCallback done) { store(shard).InitTableAsync(req, values, &resp, {}, done); });
  }
  absl::Status InitAll() {
    for (size_t i = 0; i < stores_.size(); ++i) {
      if (absl::Status s = Init(static_cast<int>(i)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The shard that leads `key` now, as a worker would route.
  int Leader(const std::string& key) const {
    for (uint32_t s : copies_.at(key)) {
      const auto& lost = routing_.lost_shards();
      const auto& back = routing_.catching_up();
      if (std::find(lost.begin(), lost.end(), s) == lost.end() &&
          std::find(back.begin(), back.end(), s) == back.end()) {
        return static_cast<int>(s);
      }
    }
    return -1;
  }

  // Worker `w`'s PushPull of step `step` on `key`, to `shard` (its leader by default).
  absl::StatusOr<std::vector<float>> PushPull(const std::string& key, uint32_t w, int64_t step, float g,
                                              int shard = -1, absl::Duration timeout = absl::Seconds(10)) {
    PushPullRequest req;
    req.set_job("job");
    req.set_worker(w);
    req.set_step(step);
    req.add_keys(key);
    PushPullResponse resp;
    std::vector<TensorBuffer> values;
    ShardStore& s = store(shard < 0 ? Leader(key) : shard);
    absl::Status st = WaitFor([&](StatusCallback done) {
      s.PushPullAsync(req, {Floats({g, -g, 2 * g, 0.5f * g})}, &resp, &values, Within(timeout), done);
    });
    if (!st.ok()) return st;
    return ToFloats(values.at(0));
  }

  ChunkView View(int shard, const std::string& key) {
    ChunkView v;
    v.value.resize(4);
    v.momentum.resize(4);
    std::vector<ShardStore::ChunkState> chunks(1);
    chunks[0].key = key;
    chunks[0].value = ShardStore::ElementSpan(v.value.data(), 4);
    chunks[0].slots = {ShardStore::ElementSpan(v.momentum.data(), 4)};
    EXPECT_TRUE(store(shard).ExportChunks("job", &chunks).ok());
    v.optimizer_step = chunks[0].optimizer_step;
    return v;
  }

  // Shard `i` is killed: its forwards fail, its calls fail.
  void Kill(int i) {
    {
      absl::MutexLock lock(&mu_);
      down_[i] = true;
    }
    store(i).Shutdown();
  }
  void Revive(int i) {
    std::unique_ptr<ShardStore> fresh = NewStore(i);
    {
      absl::MutexLock lock(&mu_);
      stores_[i].swap(fresh);
      down_[i] = false;
    }
    fresh.reset();  // the dead one, outside mu_ (its threads may be waiting on it)
  }

  // Forwards to shard `to` stay in flight from now until Release delivers them.
  void Hold(int to) {
    absl::MutexLock lock(&mu_);
    held_to_ = to;
  }
  size_t Held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  void Release() {
    std::vector<std::function<void()>> held;
    {
      absl::MutexLock lock(&mu_);
      held_to_ = -1;
      held.swap(held_);
    }
    for (auto& deliver : held) deliver();
  }

  // The coordinator's new routing, told to every shard in `to`.
  absl::Status Announce(const std::vector<int>& to) {
    routing_.set_generation(routing_.generation() + 1);
    return Tell(to);
  }
  // The current routing, told to the shards in `to` (the others later).
  absl::Status Tell(const std::vector<int>& to) {
    for (int i : to) {
      SetWorkersRequest req;
      req.set_job("job");
      for (uint32_t r = 0; r < config_.num_workers(); ++r) req.add_seats()->set_active(true);
      *req.mutable_routing() = routing_;
      SetWorkersResponse resp;
      absl::Status s = WaitFor([&](StatusCallback done) { store(i).SetWorkersAsync(req, &resp, {}, done); });
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  void Lose(int i) { routing_.add_lost_shards(i); }
  void Rejoin(int i) {
    auto* lost = routing_.mutable_lost_shards();
    lost->erase(std::remove(lost->begin(), lost->end(), static_cast<uint32_t>(i)), lost->end());
    routing_.add_catching_up(i);
  }
  void CaughtUp(int i) {
    auto* c = routing_.mutable_catching_up();
    c->erase(std::remove(c->begin(), c->end(), static_cast<uint32_t>(i)), c->end());
  }
  int forwards_to(int i) {
    absl::MutexLock lock(&mu_);
    return forwards_[i];
  }

 private:
  std::map<std::string, std::vector<uint32_t>> copies_;
  TableConfig config_;
  Routing routing_;
  absl::Mutex mu_;
  std::vector<bool> down_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> forwards_ ABSL_GUARDED_BY(mu_);
  int held_to_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<ShardStore>> stores_;
};

// Three shards, each leading one key and backing up the next one's.
const std::map<std::string, std::vector<uint32_t>> kRing = {{"a", {0, 1}}, {"b", {1, 2}}, {"c", {2, 0}}};

// Two SYNC workers run steps [from, to) on every key.
void SyncSteps(Ring& ring, int64_t from, int64_t to) {
  for (int64_t step = from; step < to; ++step) {
    for (const std::string key : {"a", "b", "c"}) {
      std::thread other([&] { ASSERT_TRUE(ring.PushPull(key, 1, step, 0.25f * (step + 1)).ok()); });
      ASSERT_TRUE(ring.PushPull(key, 0, step, 1.0f / (step + 1)).ok());
      other.join();
    }
  }
}

TEST(ShardReplication, SyncBackupsHoldEveryStepBeforeWorkersSeeIt) {
  Ring ring(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(ring.InitAll().ok());
  for (int64_t step = 0; step < 4; ++step) {
    SyncSteps(ring, step, step + 1);
    // The workers got step's result: each backup already holds it, momentum included.
    EXPECT_EQ(ring.View(1, "a"), ring.View(0, "a")) << "step " << step;
    EXPECT_EQ(ring.View(2, "b"), ring.View(1, "b"));
    EXPECT_EQ(ring.View(0, "c"), ring.View(2, "c"));
    EXPECT_EQ(ring.View(0, "a").optimizer_step, step + 1);
  }
  const TableStats stats = testing_util::Stats(ring.store(0));
  EXPECT_EQ(stats.replication().chunks_led(), 1u);
  EXPECT_EQ(stats.replication().unacked_seqs(), 0u);
  EXPECT_GE(stats.replication().forwards(), 4u);
  EXPECT_EQ(stats.replication().chunks_applied(), 4u);  // c's four steps, from shard 2
}

TEST(ShardReplication, PushesAndPullsGoToThePrimaryOnly) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  absl::StatusOr<std::vector<float>> wrong = ring.PushPull("a", 0, 0, 1.0f, /*shard=*/1);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_NE(wrong.status().message().find("led by shard 0"), std::string::npos) << wrong.status();
  EXPECT_EQ(ring.View(1, "a").optimizer_step, 0);
}

// The same SYNC job, with shard 0 killed between steps 2 and 3 (one of the
// workers' step-3 pushes already arrived there), ends with exactly the
// numbers of an uninterrupted run: no update lost, none applied twice.
TEST(ShardReplication, KilledPrimaryIsReplacedWithNoUpdateLost) {
  Ring whole(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(whole.InitAll().ok());
  SyncSteps(whole, 0, 6);

  Ring ring(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(ring.InitAll().ok());
  SyncSteps(ring, 0, 3);
  // Worker 0's step-3 push of "a" arrives at shard 0, then shard 0 dies.
  absl::StatusOr<std::vector<float>> lost;
  std::thread pusher([&] { lost = ring.PushPull("a", 0, 3, 1.0f / 4); });
  absl::SleepFor(absl::Milliseconds(100));
  ring.Kill(0);
  pusher.join();
  EXPECT_FALSE(lost.ok());
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  EXPECT_EQ(ring.Leader("a"), 1);
  EXPECT_EQ(ring.Leader("c"), 2);  // c had no backup left: shard 0 was it
  SyncSteps(ring, 3, 6);
  EXPECT_EQ(ring.View(1, "a"), whole.View(0, "a"));
  EXPECT_EQ(ring.View(1, "b"), whole.View(1, "b"));
  EXPECT_EQ(ring.View(2, "c"), whole.View(2, "c"));
}

// A shard that comes back empty (a spare in the lost one's place) is
// brought up to date by full copies while training goes on, takes its
// chunks back once the coordinator sees it caught up, and the next loss
// (of the shard that led them meanwhile) is survived too: the numbers
// are those of an uninterrupted run.
TEST(ShardReplication, RejoinedShardCatchesUpAndSurvivesTheNextLoss) {
  Ring whole(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(whole.InitAll().ok());
  SyncSteps(whole, 0, 8);

  Ring ring(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(ring.InitAll().ok());
  SyncSteps(ring, 0, 2);
  ring.Kill(0);
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  SyncSteps(ring, 2, 4);
  // The spare: a fresh table from the initial values, 4 steps behind.
  ring.Revive(0);
  ring.Rejoin(0);
  ASSERT_TRUE(ring.Init(0).ok());
  ASSERT_TRUE(ring.Announce({0, 1, 2}).ok());
  EXPECT_EQ(ring.Leader("a"), 1);  // not while it catches up
  SyncSteps(ring, 4, 5);
  EXPECT_EQ(ring.View(0, "a"), ring.View(1, "a"));
  EXPECT_EQ(ring.View(0, "c"), ring.View(2, "c"));
  for (int s : {1, 2}) {
    EXPECT_EQ(testing_util::Stats(ring.store(s)).replication().copying_to_size(), 0) << "shard " << s;
  }
  ring.CaughtUp(0);
  ASSERT_TRUE(ring.Announce({0, 1, 2}).ok());
  EXPECT_EQ(ring.Leader("a"), 0);  // its first copy again
  SyncSteps(ring, 5, 6);
  // Now shard 1 dies.
  ring.Kill(1);
  ring.Lose(1);
  ASSERT_TRUE(ring.Announce({0, 2}).ok());
  EXPECT_EQ(ring.Leader("b"), 2);
  SyncSteps(ring, 6, 8);
  EXPECT_EQ(ring.View(0, "a"), whole.View(0, "a"));
  EXPECT_EQ(ring.View(2, "b"), whole.View(1, "b"));
  EXPECT_EQ(ring.View(2, "c"), whole.View(2, "c"));
  EXPECT_EQ(ring.View(0, "c"), whole.View(2, "c"));
}

TEST(ShardReplication, PromotedBackupCopiesToTheRemainingBackup) {
  Ring whole(3, {{"a", {0, 1, 2}}}, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(whole.InitAll().ok());
  Ring ring(3, {{"a", {0, 1, 2}}}, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(whole.PushPull("a", 0, step, 0.5f + step).ok());
    if (step == 3) {
      ring.Kill(0);
      ring.Lose(0);
      ASSERT_TRUE(ring.Announce({1, 2}).ok());
    }
    ASSERT_TRUE(ring.PushPull("a", 0, step, 0.5f + step).ok());
  }
  EXPECT_EQ(ring.View(1, "a"), whole.View(0, "a"));
  EXPECT_EQ(ring.View(2, "a"), whole.View(0, "a"));
  EXPECT_EQ(testing_util::Stats(ring.store(1)).replication().generation(), 1u);
}

// A retried push of a step the old primary applied and forwarded is
// recognised by the new one (the rank's last step came with the forward).
TEST(ShardReplication, RetryAfterFailoverIsAppliedOnce) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  ASSERT_TRUE(ring.PushPull("a", 0, 0, 1.0f).ok());
  const ChunkView before = ring.View(1, "a");
  ring.Kill(0);
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  absl::StatusOr<std::vector<float>> again = ring.PushPull("a", 0, 0, 1.0f);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ring.View(1, "a"), before);
  EXPECT_EQ(*again, before.value);
}

// An old primary that was only cut off (not dead) and still takes a stale
// worker's push: its forward is refused, the push fails, and the shard
// serves nothing more; the new primary's chunk is untouched.
TEST(ShardReplication, ReplacedPrimaryIsFenced) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  ASSERT_TRUE(ring.PushPull("a", 0, 0, 1.0f).ok());
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());  // shard 0 is not told
  const ChunkView promoted = ring.View(1, "a");
  absl::StatusOr<std::vector<float>> stale = ring.PushPull("a", 0, 1, 5.0f, /*shard=*/0);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted) << stale.status();
  EXPECT_EQ(ring.View(1, "a"), promoted);
  absl::StatusOr<std::vector<float>> later = ring.PushPull("a", 0, 2, 5.0f, /*shard=*/0);
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted) << later.status();
  EXPECT_TRUE(testing_util::Stats(ring.store(0)).replication().fenced());
}

// A forward refused under a routing its primary has since left behind is
// no fence. Shard 2 leads x (its primary, shard 1, was lost and is catching
// up) and y; it forwards both to shard 1, which meanwhile caught up and
// leads x again under generation 3, so it refuses the forward. Shard 2
// learned generation 3 before the refusal came back: y is still its own.
// (Fencing y on that refusal failed tests/replication_test's stopped shard
// 1 run in 6: the workers found y's leader refusing, with no newer routing
// to mend it.)
TEST(ShardReplication, ARefusalUnderAnOlderRoutingFencesNothing) {
  Ring ring(3, {{"x", {1, 2}}, {"y", {2, 1}}}, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.Init(1).ok());  // shard 0 holds neither
  ASSERT_TRUE(ring.Init(2).ok());
  ring.Kill(1);
  ring.Lose(1);
  ASSERT_TRUE(ring.Announce({2}).ok());
  ring.Revive(1);
  ring.Rejoin(1);
  ASSERT_TRUE(ring.Init(1).ok());
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  ASSERT_TRUE(ring.PushPull("x", 0, 0, 1.0f).ok());  // the copies reach shard 1
  ring.CaughtUp(1);
  ASSERT_TRUE(ring.Announce({1}).ok());  // generation 3 reaches shard 1 first
  ring.Hold(1);
  // One push of both keys to shard 2, still at generation 2: one forward.
  PushPullRequest both;
  both.set_job("job");
  both.set_worker(0);
  both.set_step(1);
  both.add_keys("x");
  both.add_keys("y");
  PushPullResponse resp;
  std::vector<TensorBuffer> values;
  absl::Status pushed;
  std::thread pusher([&] {
    pushed = WaitFor([&](StatusCallback done) {
      ring.store(2).PushPullAsync(both, {Floats({1, 1, 1, 1}), Floats({1, 1, 1, 1})}, &resp, &values,
                                  Within(absl::Seconds(10)), done);
    });
  });
  for (int i = 0; i < 500 && ring.Held() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(ring.Held(), 1u);
  ASSERT_TRUE(ring.Tell({2}).ok());  // shard 2 hands x back
  ring.Release();                       // and then hears shard 1's refusal
  pusher.join();
  EXPECT_EQ(pushed.code(), absl::StatusCode::kAborted) << pushed;  // x moved: the worker retries there
  ASSERT_EQ(ring.Leader("y"), 2);
  absl::StatusOr<std::vector<float>> y = ring.PushPull("y", 0, 2, 0.5f);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FALSE(testing_util::Stats(ring.store(2)).replication().fenced());
  EXPECT_EQ(ring.View(1, "y"), ring.View(2, "y"));
  absl::StatusOr<std::vector<float>> x = ring.PushPull("x", 0, 2, 0.5f);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(ring.View(2, "x"), ring.View(1, "x"));
}

// A backup that is unreachable holds up the chunk's callers (the update is
// not acknowledged) until it answers again or the coordinator drops it.
TEST(ShardReplication, UnreachableBackupHoldsCallersUntilDropped) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  ring.Kill(1);  // a's backup
  absl::StatusOr<std::vector<float>> held = ring.PushPull("a", 0, 0, 1.0f, -1, absl::Milliseconds(300));
  EXPECT_EQ(held.status().code(), absl::StatusCode::kDeadlineExceeded) << held.status();
  ring.Lose(1);
  ASSERT_TRUE(ring.Announce({0, 2}).ok());
  // The retry is a duplicate of the applied push, answered now.
  absl::StatusOr<std::vector<float>> retried = ring.PushPull("a", 0, 0, 1.0f);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(ring.View(0, "a").optimizer_step, 1);
}

ReplicateRequest Forward(uint64_t generation, uint32_t from, int64_t seq, int64_t base) {
  ReplicateRequest req;
  req.set_job("job");
  req.set_generation(generation);
  req.set_from_shard(from);
  ReplicatedChunk* c = req.add_chunks();
  c->set_key("a");
  c->set_seq(seq);
  c->set_base_seq(base);
  c->set_version(seq);
  c->add_last_step(seq - 1);
  auto* set = c->add_sets();
  set->set_index(0);
  set->set_optimizer_step(seq);
  return req;
}

absl::StatusOr<int64_t> Send(ShardStore& s, const ReplicateRequest& req, std::vector<TensorBuffer> t) {
  ReplicateResponse resp;
  absl::Status st = WaitFor([&](StatusCallback done) { s.ReplicateAsync(req, t, &resp, {}, done); });
  if (!st.ok()) return st;
  return resp.seqs(0);
}

TEST(ShardReplication, ForwardsAreIdempotentOrderedAndChecked) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  ShardStore& backup = ring.store(1);
  const std::vector<TensorBuffer> t = {Floats({9, 9, 9, 9}), Floats({1, 1, 1, 1})};
  EXPECT_EQ(*Send(backup, Forward(0, 0, 2, 0), t), 2);
  const ChunkView applied = ring.View(1, "a");
  EXPECT_EQ(applied.value, std::vector<float>({9, 9, 9, 9}));
  // Again, and an older one: nothing changes.
  EXPECT_EQ(*Send(backup, Forward(0, 0, 2, 0), {Floats({7, 7, 7, 7}), Floats({7, 7, 7, 7})}), 2);
  EXPECT_EQ(*Send(backup, Forward(0, 0, 1, 0), {Floats({7, 7, 7, 7}), Floats({7, 7, 7, 7})}), 2);
  // Built on a state the backup lacks (seq 3): not applied, its seq answered.
  EXPECT_EQ(*Send(backup, Forward(0, 0, 5, 3), t), 2);
  EXPECT_EQ(ring.View(1, "a"), applied);
  // From a shard that does not lead the key, or of another generation.
  EXPECT_EQ(Send(backup, Forward(0, 2, 6, -1), t).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Send(backup, Forward(1, 0, 6, -1), t).status().code(), absl::StatusCode::kUnavailable);
  // Hostile shapes and counts.
  EXPECT_EQ(Send(backup, Forward(0, 0, 6, -1), {Floats({1, 2, 3})}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send(backup, Forward(0, 0, 6, -1), {Floats({1, 2, 3, 4}), Floats({1, 2, 3})}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send(backup, Forward(0, 0, 6, -1), {t[0], t[1], t[1]}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ReplicateRequest bad_set = Forward(0, 0, 6, -1);
  bad_set.mutable_chunks(0)->mutable_sets(0)->set_index(7);
  EXPECT_EQ(Send(backup, bad_set, t).status().code(), absl::StatusCode::kInvalidArgument);
  ReplicateRequest unknown = Forward(0, 0, 6, -1);
  unknown.mutable_chunks(0)->set_key("zz");
  EXPECT_EQ(Send(backup, unknown, t).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ring.View(1, "a"), applied);
}

TEST(ShardReplication, HostileCopiesAreRefused) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  auto init = [&](std::vector<uint32_t> copies, uint32_t shard) {
    InitTableRequest req;
    req.set_job("job");
    *req.mutable_config() = MomentumConfig(ASYNC, 1);
    req.set_shard(shard);
    *req.mutable_routing() = ring.routing();
    req.add_keys("a");
    req.add_copies()->mutable_shards()->Add(copies.begin(), copies.end());
    InitTableResponse resp;
    return WaitFor([&](StatusCallback done) { ring.store(0).InitTableAsync(req, {Floats({1})}, &resp, {}, done); });
  };
  EXPECT_EQ(init({1, 2}, 0).code(), absl::StatusCode::kInvalidArgument);     // not this shard's
  EXPECT_EQ(init({0, 0}, 0).code(), absl::StatusCode::kInvalidArgument);     // twice
  EXPECT_EQ(init({0, 3}, 0).code(), absl::StatusCode::kInvalidArgument);     // no shard 3
  EXPECT_EQ(init({0, 1}, 5).code(), absl::StatusCode::kInvalidArgument);     // no shard 5
  EXPECT_EQ(init({}, 0).code(), absl::StatusCode::kInvalidArgument);         // none
  EXPECT_TRUE(init({0, 1}, 0).ok());
  EXPECT_EQ(init({0, 2}, 0).code(), absl::StatusCode::kAlreadyExists);  // another layout
}

}  // namespace
}  // namespace pstrain
