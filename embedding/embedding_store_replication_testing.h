// The replicated-embedding tests' fixture: three EmbeddingStores and a
// spare in one process, forwarding to one another as pstrain-ps does over
// gRPC (embedding_store_replication_test, embedding_store_handback_test).
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_STORE_REPLICATION_TESTING_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_STORE_REPLICATION_TESTING_H_

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "embedding/embedding_store.h"
#include "embedding/row_math.h"

namespace pstrain {

constexpr int kDim = 3;
constexpr uint32_t kShards = 3;
constexpr uint32_t kVirtualShards = 64;

inline std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// Three shards and a spare; shard i is at target "s<i>", the spare at "s3".
// Forwards to a target in `unreachable` fail with UNAVAILABLE, as to a
// shard that is down; the next `refuse[i]` forwards to shard i fail with
// FAILED_PRECONDITION (an error a round does not retry by itself).
class ReplicatedShards : public ::testing::Test {
 protected:
  void SetUp() override { Start(absl::Minutes(1)); }

  void Start(absl::Duration max_wait) {
    for (uint32_t i = 0; i <= kShards; ++i) {
      EmbeddingStoreOptions o;
      o.max_wait = max_wait;
      o.forward = [this](const std::string& target, const ReplicateEmbeddingsRequest& request,
                         ReplicateEmbeddingsResponse* response) {
        const int to = target[1] - '0';
        if (unreachable_[to].load()) return absl::UnavailableError("shard down");
        if (refuse_[to].load() > 0) {
          --refuse_[to];
          return absl::FailedPreconditionError("refused once");
        }
        ++forwards_;
        if (request.has_copy_init()) {
          absl::MutexLock lock(&copies_mu_);
          copy_inits_.push_back(request);
        }
        return shards_[to]->Replicate(request, response);
      };
      shards_[i] = std::make_unique<EmbeddingStore>(o);
    }
  }

  InitEmbeddingsRequest Init(Consistency c, uint32_t workers, uint32_t replicas, uint32_t shard) const {
    InitEmbeddingsRequest r;
    r.set_job("ctr");
    r.set_attempt(1);
    r.set_num_workers(workers);
    r.set_consistency(c);
    r.set_num_shards(kShards);
    r.set_shard_index(shard);
    r.set_replicas(replicas);
    for (uint32_t i = 0; i < kShards; ++i) r.mutable_routing()->add_targets(absl::StrCat("s", i));
    EmbeddingTableConfig* t = r.add_tables();
    t->set_name("user");
    t->set_dim(kDim);
    t->set_virtual_shards(kVirtualShards);
    t->set_seed(7);
    t->mutable_optimizer()->set_kind(EmbeddingOptimizer::LAZY_ADAM);  // slots that must travel too
    t->mutable_optimizer()->set_lr(0.05);
    return r;
  }

  void CreateJob(Consistency c, uint32_t workers, uint32_t replicas) {
    for (uint32_t i = 0; i < kShards; ++i) {
      InitEmbeddingsResponse response;
      ASSERT_TRUE(shards_[i]->Init(Init(c, workers, replicas, i), &response).ok());
    }
  }

  // Ids of slot `slot` (their virtual shard maps to shard `slot`).
  static std::vector<int64_t> IdsOf(uint32_t slot, int n) {
    std::vector<int64_t> ids;
    for (int64_t id = 1; static_cast<int>(ids.size()) < n; ++id) {
      if (ShardOfId(id * 7919, kVirtualShards, kShards) == slot) ids.push_back(id * 7919);
    }
    return ids;
  }

  template <typename Request>
  static Request RequestOf(uint32_t slot, uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
    Request r;
    r.set_job("ctr");
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    r.set_slot(slot);
    EmbeddingIds* e = r.add_tables();
    e->set_table("user");
    e->set_ids(Bytes(ids.data(), ids.size() * sizeof(int64_t)));
    return r;
  }

  absl::Status Lookup(uint32_t shard, uint32_t slot, uint32_t rank, int64_t step, const std::vector<int64_t>& ids,
                      std::vector<float>* values = nullptr, bool read_only = false) {
    auto request = RequestOf<EmbeddingLookupRequest>(slot, rank, step, ids);
    request.set_read_only(read_only);
    EmbeddingLookupResponse response;
    absl::Status s = shards_[shard]->Lookup(request, absl::Now() + absl::Seconds(20), &response);
    if (s.ok() && values != nullptr) {
      values->resize(response.values(0).size() / sizeof(float));
      std::memcpy(values->data(), response.values(0).data(), response.values(0).size());
    }
    return s;
  }

  // A gradient of n rows that differs per rank, step and row.
  static std::vector<float> GradsOf(uint32_t rank, int64_t step, size_t n) {
    std::vector<float> grads;
    for (size_t i = 0; i < n; ++i) {
      for (int j = 0; j < kDim; ++j) grads.push_back(0.01f * (rank + 1) * (step + 1) + 0.001f * i - 0.002f * j);
    }
    return grads;
  }

  absl::Status Update(uint32_t shard, uint32_t slot, uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
    auto request = RequestOf<EmbeddingUpdateRequest>(slot, rank, step, ids);
    const std::vector<float> grads = GradsOf(rank, step, ids.size());
    request.add_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
    return shards_[shard]->Update(request);
  }

  // The coordinator's routing: shards `lost` are gone, `catching_up` are
  // spares being copied; with `spare`, the spare ("s3") is in shard 1's place.
  void Route(uint64_t generation, const std::vector<uint32_t>& lost, const std::vector<uint32_t>& told,
             const std::vector<uint32_t>& catching_up = {}, bool spare = false) {
    SetWorkersRequest r;
    r.set_job("ctr");
    r.set_attempt(1);
    r.mutable_routing()->set_generation(generation);
    for (uint32_t s : lost) r.mutable_routing()->add_lost_shards(s);
    for (uint32_t s : catching_up) r.mutable_routing()->add_catching_up(s);
    for (uint32_t i = 0; i < kShards; ++i) r.mutable_routing()->add_targets(absl::StrCat("s", spare && i == 1 ? 3 : i));
    for (uint32_t s : told) shards_[s]->SetWorkers(r);
  }

  std::array<std::unique_ptr<EmbeddingStore>, kShards + 1> shards_;  // [kShards]: the spare
  std::array<std::atomic<bool>, kShards + 1> unreachable_{};
  std::array<std::atomic<int>, kShards + 1> refuse_{};
  std::atomic<int> forwards_{0};
  absl::Mutex copies_mu_;
  std::vector<ReplicateEmbeddingsRequest> copy_inits_ ABSL_GUARDED_BY(copies_mu_);  // each copy's first request
};

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_STORE_REPLICATION_TESTING_H_
