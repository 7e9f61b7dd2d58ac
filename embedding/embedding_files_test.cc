// Embedding checkpoint files: a round trip, a restore onto another shard
// count, rows never torn by updates racing the save, incremental files and
// their chains, and files that are cut short, altered or not the job's
// refused.
#include "embedding/embedding_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <thread>

#include "embedding/row_math.h"

namespace pstrain {
namespace {

using Rows = std::map<int64_t, std::vector<float>>;  // id -> value then slots

EmbeddingTableConfig Config(EmbeddingOptimizer::Kind kind = EmbeddingOptimizer::ADAGRAD) {
  EmbeddingTableConfig c;
  c.set_name("user");
  c.set_dim(4);
  c.mutable_optimizer()->set_kind(kind);
  c.mutable_optimizer()->set_lr(0.1);
  EXPECT_TRUE(NormalizeEmbeddingConfig(&c).ok());
  return c;
}

std::unique_ptr<EmbeddingTable> Make(int stripes = 8) {
  return std::move(*EmbeddingTable::Create(Config(), nullptr, stripes));
}

Rows RowsOf(const EmbeddingTable& t) {
  Rows rows;
  EXPECT_TRUE(t.ForEachRow([&](const EmbeddingRowView& r) {
                 std::vector<float>& v = rows[r.id];
                 v.assign(r.value, r.value + t.dim());
                 v.insert(v.end(), r.slots, r.slots + t.slot_floats());
                 v.push_back(static_cast<float>(r.last_step));
                 return absl::OkStatus();
               }).ok());
  return rows;
}

// Rows 0..n-1 (times a large odd number: ids all over int64), trained once.
void Fill(EmbeddingTable& t, int n, int64_t step = 1) {
  std::vector<int64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i - n / 2) * 0x9e3779b97f4aLL;
  std::vector<float> out(n * 4), g(n * 4, 0.5f);
  ASSERT_TRUE(t.Lookup(ids, step, out.data()).ok());
  ASSERT_TRUE(t.Update(ids, g.data(), step, 1.0).ok());
}

EmbeddingFileHeader Header() {
  EmbeddingFileHeader h;
  h.set_job("ctr");
  *h.add_tables() = Config();
  return h;
}

std::string Dir() { return ::testing::TempDir(); }

// Looks up and trains rows from..to-1 (times a large odd number) at `step`.
void Train(EmbeddingTable& t, int64_t from, int64_t to, int64_t step) {
  std::vector<int64_t> ids;
  for (int64_t i = from; i < to; ++i) ids.push_back(i * 0x9e3779b97f4aLL);
  std::vector<float> out(ids.size() * 4), g(ids.size() * 4, 0.25f);
  ASSERT_TRUE(t.Lookup(ids, step, out.data()).ok());
  ASSERT_TRUE(t.Update(ids, g.data(), step, 1.0).ok());
}

// The header of checkpoint `id`'s file of table `c`, incremental on `base`.
EmbeddingFileHeader ChainHeader(const EmbeddingTableConfig& c, uint64_t id, uint64_t base) {
  EmbeddingFileHeader h;
  h.set_job("ctr");
  *h.add_tables() = c;
  h.set_checkpoint_id(id);
  h.set_base_id(base);
  return h;
}

TEST(EmbeddingFilesTest, RowsComeBackAsTheyWere) {
  auto a = Make(8);
  Fill(*a, 1000);
  const std::string path = Dir() + "/round-trip.emb";
  auto info = WriteEmbeddingFile(path, Header(), {a.get()});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, 1000);
  EXPECT_GT(info->bytes, 1000u * (8 + 8 + 4 + 8 * 4));
  auto b = Make(64);
  EmbeddingFileHeader header;
  ASSERT_TRUE(ReadEmbeddingFile(
                  path, {b.get()}, [](size_t, int64_t) { return true; }, &header)
                  .ok());
  EXPECT_EQ(header.job(), "ctr");
  EXPECT_EQ(RowsOf(*a), RowsOf(*b));
}

TEST(EmbeddingFilesTest, ThreeShardsFilesRestoreOntoTwoShards) {
  std::vector<std::unique_ptr<EmbeddingTable>> three;
  auto whole = Make();
  Fill(*whole, 3000);
  for (int s = 0; s < 3; ++s) three.push_back(Make());
  for (const auto& [id, v] : RowsOf(*whole)) {
    EmbeddingRowView r{id, v.data(), v.data() + 4, static_cast<int64_t>(v.back()), 1};
    ASSERT_TRUE(three[ShardOfId(id, 1024, 3)]->InsertRow(r).ok());
  }
  std::vector<std::string> files;
  for (int s = 0; s < 3; ++s) {
    files.push_back(Dir() + "/shard-" + std::to_string(s) + ".emb");
    ASSERT_TRUE(WriteEmbeddingFile(files.back(), Header(), {three[s].get()}).ok());
  }
  Rows restored;
  for (uint32_t s = 0; s < 2; ++s) {
    auto t = Make();
    for (const std::string& f : files) {
      ASSERT_TRUE(ReadEmbeddingFile(
                      f, {t.get()}, [s](size_t, int64_t id) { return ShardOfId(id, 1024, 2) == s; }, nullptr)
                      .ok());
    }
    for (const auto& [id, v] : RowsOf(*t)) {
      EXPECT_EQ(ShardOfId(id, 1024, 2), s) << id;
      restored[id] = v;
    }
  }
  EXPECT_EQ(restored, RowsOf(*whole));
}

TEST(EmbeddingFilesTest, UpdatesRacingASaveNeverTearARow) {
  // Adagrad, gradient 1 everywhere: after k updates the accumulator is k,
  // so a saved row whose value does not fit its accumulator was torn.
  auto t = Make(4);
  std::vector<int64_t> ids(256);
  for (int i = 0; i < 256; ++i) ids[i] = i;
  std::vector<float> first(256 * 4), ones(256 * 4, 1.0f);
  ASSERT_TRUE(t->Lookup(ids, 1, first.data()).ok());
  std::vector<float> cumulative(3 * 3000 + 1, 0.0f);
  for (size_t k = 1; k < cumulative.size(); ++k) {
    cumulative[k] = cumulative[k - 1] + 0.1f * (1.0f / (std::sqrt(static_cast<float>(k)) + 1e-10f));
  }
  std::atomic<int> running{3};
  std::vector<std::thread> pushers;
  for (int w = 0; w < 3; ++w) {
    pushers.emplace_back([&] {
      for (int step = 1; step <= 3000; ++step) ASSERT_TRUE(t->Update(ids, ones.data(), step, 1.0).ok());
      --running;
    });
  }
  int saves = 0, during = 0;
  while (saves < 5 || running > 0) {
    during += running > 0;
    const std::string path = Dir() + "/race.emb";
    ASSERT_TRUE(WriteEmbeddingFile(path, Header(), {t.get()}).ok());
    auto back = Make();
    ASSERT_TRUE(ReadEmbeddingFile(
                    path, {back.get()}, [](size_t, int64_t) { return true; }, nullptr)
                    .ok());
    for (const auto& [id, v] : RowsOf(*back)) {
      const int k = static_cast<int>(v[4]);
      for (int j = 0; j < 4; ++j) {
        ASSERT_EQ(v[4 + j], k) << "id " << id;
        ASSERT_NEAR(v[j], first[id * 4 + j] - cumulative[k], 1e-3) << "id " << id << " after " << k;
      }
    }
    ++saves;
  }
  for (auto& p : pushers) p.join();
  EXPECT_GT(during, 0);
}

// A whole file, then two incremental ones: rows updated, rows created, and
// rows evicted between them. The chain read back is the table as it is now
// (rows evicted since the whole file are gone), and the incremental files
// write whole only what changed.
TEST(EmbeddingFilesTest, AnIncrementalChainReadsBackAsTheTableIsNow) {
  EmbeddingTableConfig c = Config();
  c.mutable_eviction()->set_ttl_steps(5);
  auto t = std::move(*EmbeddingTable::Create(c, nullptr, 8));
  auto train = [&t](int64_t from, int64_t to, int64_t step) { Train(*t, from, to, step); };
  auto header = [&c](uint64_t id, uint64_t base) { return ChainHeader(c, id, base); };
  const std::string whole = Dir() + "/chain-1.emb", second = Dir() + "/chain-2.emb", third = Dir() + "/chain-3.emb";
  train(0, 1000, 1);
  const uint32_t e1 = t->NextEpoch();
  auto info = WriteEmbeddingFile(whole, header(1, 0), {t.get()});
  ASSERT_TRUE(info.ok()) << info.status();
  train(0, 600, 4);     // 600 changed, 400 not
  train(1000, 1050, 4);  // 50 new
  const uint32_t e2 = t->NextEpoch();
  info = WriteEmbeddingFile(second, header(2, 1), {t.get()}, {e1});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, 650);
  EXPECT_EQ(info->unchanged_rows, 400);
  train(0, 300, 8);
  train(2000, 2020, 8);
  EXPECT_EQ(t->EvictExpired(8), 400);  // last touched at step 1
  t->NextEpoch();
  info = WriteEmbeddingFile(third, header(3, 2), {t.get()}, {e2});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, 320);
  EXPECT_EQ(info->unchanged_rows, 350);
  EXPECT_TRUE(info->incremental);

  auto back = ReadEmbeddingFiles({{whole}, {second}, {third}});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(RowsOf(*(*back)[0]), RowsOf(*t));
  EXPECT_EQ((*back)[0]->Stats().rows, 670);
  // Onto two shards, each keeping its own rows.
  Rows halves;
  for (uint32_t s = 0; s < 2; ++s) {
    auto half = Make();
    auto mine = [s](size_t, int64_t id) { return ShardOfId(id, 1024, 2) == s; };
    auto id = ReadEmbeddingChain({{whole}, {second}, {third}}, {half.get()}, mine);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, 3u);
    for (const auto& [row, v] : RowsOf(*half)) halves[row] = v;
  }
  EXPECT_EQ(halves, RowsOf(*t));

  // A chain that does not hold together.
  for (const auto& chain : std::vector<std::vector<std::vector<std::string>>>{
           {{third}}, {{whole}, {third}}, {{second}, {third}}, {{whole, second}, {third}}}) {
    auto bad = ReadEmbeddingFiles(chain);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << chain.size() << " " << bad.status();
  }
  auto lone = Make();
  absl::Status s = ReadEmbeddingFile(second, {lone.get()}, [](size_t, int64_t) { return true; }, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("unchanged since checkpoint 1"), std::string::npos) << s;
}

// A table at its eviction cap (LRU), restored from a whole checkpoint and
// an incremental one into a table of the same cap: the rows the newest
// names are all there (read in one pass, its new rows would have evicted
// the older rows it names by id).
TEST(EmbeddingFilesTest, AChainRestoresATableAtItsMemoryCap) {
  EmbeddingTableConfig c = Config();
  c.mutable_eviction()->set_max_memory_mb(1);
  auto make = [&c] { return std::move(*EmbeddingTable::Create(c, nullptr, 8)); };
  auto t = make();
  auto train = [&t](int64_t from, int64_t to, int64_t step) { Train(*t, from, to, step); };
  auto header = [&c](uint64_t id, uint64_t base) { return ChainHeader(c, id, base); };
  train(0, 30000, 1);
  ASSERT_GT(t->Stats().evicted_lru, 0) << "the table is at its cap";
  const std::string whole = Dir() + "/capped-1.emb", next = Dir() + "/capped-2.emb";
  const uint32_t e1 = t->NextEpoch();
  ASSERT_TRUE(WriteEmbeddingFile(whole, header(1, 0), {t.get()}).ok());
  train(29000, 30000, 2);  // the newest rows, updated
  train(40000, 44000, 2);  // new rows, evicting the oldest
  t->NextEpoch();
  auto info = WriteEmbeddingFile(next, header(2, 1), {t.get()}, {e1});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GT(info->unchanged_rows, 0);
  auto back = make();
  auto read = ReadEmbeddingChain({{whole}, {next}}, {back.get()}, [](size_t, int64_t) { return true; });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(back->Stats().rows, t->Stats().rows);
  EXPECT_TRUE(RowsOf(*back) == RowsOf(*t));
  EXPECT_EQ(back->Stats().evicted_lru, 0);
}

TEST(EmbeddingFilesTest, FilesCutShortAlteredOrOfOtherTablesAreRefused) {
  auto a = Make();
  Fill(*a, 200);
  const std::string path = Dir() + "/good.emb";
  ASSERT_TRUE(WriteEmbeddingFile(path, Header(), {a.get()}).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& name, const std::string& b) {
    std::ofstream(Dir() + "/" + name, std::ios::binary) << b;
    return Dir() + "/" + name;
  };
  auto read = [&](const std::string& p) {
    auto t = Make();
    return ReadEmbeddingFile(
        p, {t.get()}, [](size_t, int64_t) { return true; }, nullptr);
  };
  std::string altered = bytes;
  altered[bytes.size() / 2] ^= 0x01;  // a bit of some row's value
  EXPECT_EQ(read(write("altered.emb", altered)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(read(write("short.emb", bytes.substr(0, bytes.size() - 9))).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(read(write("long.emb", bytes + "x")).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(read(write("empty.emb", "")).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(read(Dir()).code(), absl::StatusCode::kInvalidArgument);  // a directory
  const std::string link = Dir() + "/link.emb";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  EXPECT_FALSE(read(link).ok());  // never followed
  auto lazy = std::move(*EmbeddingTable::Create(Config(EmbeddingOptimizer::LAZY_ADAM), nullptr));
  absl::Status s = ReadEmbeddingFile(
      path, {lazy.get()}, [](size_t, int64_t) { return true; }, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(read(path).ok());
}

}  // namespace
}  // namespace pstrain
