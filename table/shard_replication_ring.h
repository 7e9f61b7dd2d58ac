// The fixture of the replicated tables' tests (shard_replication_test.cc,
// shard_replication_fencing_test.cc): shards in one process, forwarding to
// each other through ReplicateAsync as pstrain-ps does over gRPC. A "lost"
// shard is shut down and its forwards fail, as a killed process's would.
#ifndef PSTRAIN_TABLE_SHARD_REPLICATION_RING_H_
#define PSTRAIN_TABLE_SHARD_REPLICATION_RING_H_

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "table/shard_store_testing.h"

namespace pstrain {
namespace replication_testing {

using testing_util::Floats;
using testing_util::ToFloats;
using testing_util::Within;

// SGD with momentum: the state a promoted backup must continue with.
inline TableConfig MomentumConfig(Consistency consistency, uint32_t workers) {
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
inline const std::map<std::string, std::vector<uint32_t>> kRing = {{"a", {0, 1}}, {"b", {1, 2}}, {"c", {2, 0}}};

// Two SYNC workers run steps [from, to) on every key.
inline void SyncSteps(Ring& ring, int64_t from, int64_t to) {
  for (int64_t step = from; step < to; ++step) {
    for (const std::string key : {"a", "b", "c"}) {
      std::thread other([&] { ASSERT_TRUE(ring.PushPull(key, 1, step, 0.25f * (step + 1)).ok()); });
      ASSERT_TRUE(ring.PushPull(key, 0, step, 1.0f / (step + 1)).ok());
      other.join();
    }
  }
}

}  // namespace replication_testing
}  // namespace pstrain

#endif  // PSTRAIN_TABLE_SHARD_REPLICATION_RING_H_
