#include "common/partition_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace pstrain {
namespace {

std::vector<ParameterSpec> RandomModel(std::mt19937* rng, int n) {
  std::vector<ParameterSpec> params;
  std::uniform_int_distribution<int> rows(1, 3000), cols(1, 1200);
  for (int i = 0; i < n; ++i) {
    ParameterSpec p;
    p.name = "layer" + std::to_string(i) + ".weight";
    p.shape = {rows(*rng), cols(*rng)};
    p.dtype = (i % 7 == 0) ? DT_FLOAT64 : DT_FLOAT32;
    params.push_back(p);
  }
  return params;
}

TEST(PartitionPlanTest, ChunksCoverEveryParameterExactlyAndRespectChunkBytes) {
  std::mt19937 rng(1);
  auto params = RandomModel(&rng, 30);
  const size_t chunk_bytes = 1 << 20;
  auto plan = MakePartitionPlan(params, 3, chunk_bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (size_t p = 0; p < params.size(); ++p) {
    int64_t numel = 1;
    for (int64_t d : params[p].shape) numel *= d;
    int64_t next = 0;
    for (const ChunkSpec& c : plan->chunks) {
      if (c.param != p) continue;
      EXPECT_EQ(c.offset, next) << c.key;
      EXPECT_LE(c.bytes, chunk_bytes) << c.key;
      EXPECT_GT(c.numel, 0);
      next += c.numel;
    }
    EXPECT_EQ(next, numel) << params[p].name;
  }
}

TEST(PartitionPlanTest, LargestShardWithinTenPercentOfMeanPlusOneChunk) {
  for (int seed = 0; seed < 20; ++seed) {
    std::mt19937 rng(seed);
    auto params = RandomModel(&rng, 5 + seed * 3);
    for (int shards : {1, 2, 3, 4, 7, 16}) {
      auto plan = MakePartitionPlan(params, shards, 512 << 10);
      ASSERT_TRUE(plan.ok()) << plan.status();
      size_t total = std::accumulate(plan->shard_bytes.begin(), plan->shard_bytes.end(), size_t{0});
      size_t largest_chunk = 0;
      for (const ChunkSpec& c : plan->chunks) largest_chunk = std::max(largest_chunk, c.bytes);
      const double mean = static_cast<double>(total) / shards;
      const size_t largest = *std::max_element(plan->shard_bytes.begin(), plan->shard_bytes.end());
      EXPECT_LE(largest, 1.1 * mean + largest_chunk) << "seed " << seed << " shards " << shards;
      size_t recount = 0;
      for (int s = 0; s < shards; ++s) {
        size_t b = 0;
        for (size_t i : plan->shard_chunks[s]) {
          EXPECT_EQ(plan->chunks[i].shard, s);
          b += plan->chunks[i].bytes;
        }
        EXPECT_EQ(b, plan->shard_bytes[s]);
        recount += plan->shard_chunks[s].size();
      }
      EXPECT_EQ(recount, plan->chunks.size());
    }
  }
}

TEST(PartitionPlanTest, DeterministicAcrossCalls) {
  std::mt19937 rng(7);
  auto params = RandomModel(&rng, 40);
  auto a = MakePartitionPlan(params, 5, 256 << 10);
  auto b = MakePartitionPlan(params, 5, 256 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->chunks.size(), b->chunks.size());
  for (size_t i = 0; i < a->chunks.size(); ++i) {
    EXPECT_EQ(a->chunks[i].key, b->chunks[i].key);
    EXPECT_EQ(a->chunks[i].shard, b->chunks[i].shard);
    EXPECT_EQ(a->chunks[i].offset, b->chunks[i].offset);
  }
}

TEST(PartitionPlanTest, SplitsOneLargeTensorEvenlyAcrossShards) {
  // 10M float32 in one tensor: 10 chunks of <= 4 MiB over 2 shards.
  auto plan = MakePartitionPlan({{"flat", {10'000'000}, DT_FLOAT32}}, 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->chunks.size(), 10u);
  EXPECT_EQ(plan->shard_bytes[0], plan->shard_bytes[1]);
}

// Issue 34's placement: R backups per chunk on R other shards, spread as
// the primaries are, and the primaries where R = 0 put them.
TEST(PartitionPlanTest, ReplicasGoToDistinctShardsAndSpreadLikePrimaries) {
  for (int seed = 0; seed < 12; ++seed) {
    std::mt19937 rng(seed);
    auto params = RandomModel(&rng, 6 + seed * 3);
    for (int shards : {2, 3, 4, 7, 16}) {
      auto plain = MakePartitionPlan(params, shards, 512 << 10);
      ASSERT_TRUE(plain.ok());
      for (int replicas = 1; replicas < std::min(shards, 4); ++replicas) {
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " shards " << shards << " replicas " << replicas);
        auto plan = MakePartitionPlan(params, shards, 512 << 10, replicas);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_EQ(plan->chunks.size(), plain->chunks.size());
        size_t largest_chunk = 0, total = 0;
        std::vector<size_t> backup_bytes(shards, 0);
        for (size_t i = 0; i < plan->chunks.size(); ++i) {
          const ChunkSpec& c = plan->chunks[i];
          EXPECT_EQ(c.shard, plain->chunks[i].shard) << c.key;  // primaries never move
          ASSERT_EQ(c.backups.size(), static_cast<size_t>(replicas)) << c.key;
          std::vector<int> copies = c.backups;
          copies.push_back(c.shard);
          std::sort(copies.begin(), copies.end());
          EXPECT_EQ(std::adjacent_find(copies.begin(), copies.end()), copies.end()) << c.key << ": two copies on a shard";
          for (int s : c.backups) {
            ASSERT_GE(s, 0);
            ASSERT_LT(s, shards);
            backup_bytes[s] += c.bytes;
          }
          largest_chunk = std::max(largest_chunk, c.bytes);
          total += c.bytes;
        }
        EXPECT_EQ(backup_bytes, plan->shard_backup_bytes);
        // Each shard's backups: within the mean plus two chunks (the
        // distinct-shard rule can cost one more than the primaries' bound).
        const double mean = static_cast<double>(total) * replicas / shards;
        for (int s = 0; s < shards; ++s) {
          EXPECT_LE(backup_bytes[s], 1.1 * mean + 2 * largest_chunk) << "shard " << s;
          size_t listed = 0;
          for (size_t i : plan->shard_backup_chunks[s]) listed += plan->chunks[i].bytes;
          EXPECT_EQ(listed, backup_bytes[s]);
        }
      }
    }
  }
  // Deterministic.
  std::mt19937 rng(3);
  auto params = RandomModel(&rng, 20);
  auto a = MakePartitionPlan(params, 5, 256 << 10, 2), b = MakePartitionPlan(params, 5, 256 << 10, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->chunks.size(); ++i) EXPECT_EQ(a->chunks[i].backups, b->chunks[i].backups);
}

TEST(PartitionPlanTest, RejectsBadInput) {
  EXPECT_EQ(MakePartitionPlan({{"a", {2}, DT_FLOAT32}}, 2, 1024, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // two backups need three shards
  EXPECT_EQ(MakePartitionPlan({{"a", {2}, DT_FLOAT32}}, 2, 1024, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePartitionPlan({{"a", {2}, DT_FLOAT32}}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePartitionPlan({{"a", {2}, DT_FLOAT32}}, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePartitionPlan({{"a", {2}, DT_FLOAT32}, {"a", {3}, DT_FLOAT32}}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePartitionPlan({{"a", {-2}, DT_FLOAT32}}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePartitionPlan({{"", {2}, DT_FLOAT32}}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePartitionPlan({{"a", {2}, DT_INVALID}}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A stage's part of the whole model's plan: its chunks where the whole
// plan put them, referring to the stage's own parameter list.
TEST(PartitionPlanTest, RestrictPlanKeepsTheWholePlansShards) {
  std::mt19937 rng(5);
  auto params = RandomModel(&rng, 12);
  auto whole = MakePartitionPlan(params, 3, 1 << 20);
  ASSERT_TRUE(whole.ok());
  const std::vector<ParameterSpec> stage = {params[7], params[4], params[5]};
  auto part = RestrictPlan(*whole, stage);
  ASSERT_TRUE(part.ok()) << part.status();
  size_t want = 0;
  for (const ChunkSpec& c : whole->chunks) want += (c.param == 4 || c.param == 5 || c.param == 7) ? 1 : 0;
  ASSERT_EQ(part->chunks.size(), want);
  std::vector<size_t> bytes(3, 0);
  for (size_t i = 0; i < part->chunks.size(); ++i) {
    const ChunkSpec& c = part->chunks[i];
    auto it = std::find_if(whole->chunks.begin(), whole->chunks.end(), [&](const ChunkSpec& w) { return w.key == c.key; });
    ASSERT_NE(it, whole->chunks.end());
    EXPECT_EQ(c.shard, it->shard) << c.key;
    EXPECT_EQ(part->params[c.param].name, whole->params[it->param].name) << c.key;
    EXPECT_NE(std::find(part->shard_chunks[c.shard].begin(), part->shard_chunks[c.shard].end(), i),
              part->shard_chunks[c.shard].end());
    bytes[c.shard] += c.bytes;
  }
  EXPECT_EQ(part->shard_bytes, bytes);
  ParameterSpec stranger = params[0];
  stranger.shape.push_back(2);
  EXPECT_FALSE(RestrictPlan(*whole, {stranger}).ok());
  EXPECT_FALSE(RestrictPlan(*whole, {params[1], params[1]}).ok());
  EXPECT_FALSE(RestrictPlan(*MakePartitionPlan(params, 3, 1 << 20, 1), {params[1]}).ok());
}

}  // namespace
}  // namespace pstrain
