// What the EmbeddingStore tests share: a job "ctr" of one table "user"
// (dim 2, SGD at lr 1, rows starting at zero), its requests, and reads.
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_STORE_TESTING_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_STORE_TESTING_H_

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "embedding/embedding_store.h"

namespace pstrain {
namespace embedding_store_testing {

inline constexpr int kDim = 2;

inline InitEmbeddingsRequest Init(Consistency consistency, uint32_t workers, uint64_t attempt = 1) {
  InitEmbeddingsRequest r;
  r.set_job("ctr");
  r.set_attempt(attempt);
  r.set_num_workers(workers);
  r.set_consistency(consistency);
  r.set_num_shards(1);
  EmbeddingTableConfig* t = r.add_tables();
  t->set_name("user");
  t->set_dim(kDim);
  t->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
  t->mutable_optimizer()->set_lr(1.0);
  t->mutable_initializer()->set_kind(EmbeddingInitializer::ZEROS);
  return r;
}

inline std::string Bytes(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}
inline std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A request of job "ctr" attempt 1 for table "user".
template <typename Request>
Request RequestOf(uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
  Request r;
  r.set_job("ctr");
  r.set_attempt(1);
  r.set_rank(rank);
  r.set_step(step);
  EmbeddingIds* e = r.add_tables();
  e->set_table("user");
  e->set_ids(Bytes(ids));
  return r;
}

inline EmbeddingLookupRequest LookupOf(uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
  return RequestOf<EmbeddingLookupRequest>(rank, step, ids);
}

inline EmbeddingUpdateRequest UpdateOf(uint32_t rank, int64_t step, const std::vector<int64_t>& ids,
                                const std::vector<float>& grads) {
  EmbeddingUpdateRequest r = RequestOf<EmbeddingUpdateRequest>(rank, step, ids);
  r.add_grads(Bytes(grads));
  return r;
}

inline std::vector<float> Values(const EmbeddingLookupResponse& r, int table = 0) {
  std::vector<float> v(r.values(table).size() / sizeof(float));
  std::memcpy(v.data(), r.values(table).data(), r.values(table).size());
  return v;
}

inline absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

inline void CreateJob(EmbeddingStore& store, Consistency c, uint32_t workers, uint32_t staleness = 0) {
  InitEmbeddingsRequest init = Init(c, workers);
  init.set_staleness(staleness);
  InitEmbeddingsResponse response;
  ASSERT_TRUE(store.Init(init, &response).ok());
  ASSERT_TRUE(response.created());
}

// Whether `rank`'s lookup for `step` is still held (50 ms).
inline bool Held(EmbeddingStore& store, uint32_t rank, int64_t step) {
  EmbeddingLookupResponse r;
  return store.Lookup(LookupOf(rank, step, {1}), absl::Now() + absl::Milliseconds(50), &r).code() ==
         absl::StatusCode::kDeadlineExceeded;
}

inline std::vector<float> Read(EmbeddingStore& store, const std::vector<int64_t>& ids, int64_t step = 0) {
  EmbeddingLookupResponse response;
  absl::Status s = store.Lookup(LookupOf(0, step, ids), Soon(), &response);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? Values(response) : std::vector<float>();
}


}  // namespace embedding_store_testing
}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_STORE_TESTING_H_
