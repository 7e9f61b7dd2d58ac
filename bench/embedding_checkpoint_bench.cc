// embedding_checkpoint_bench: `bench/run.sh embckpt`. A shard's embedding
// tables checkpointed whole and incrementally, through EmbeddingStore's own
// Save and Load (what SaveEmbeddings and LoadEmbeddings run; files written
// to a temporary name, fsynced, renamed).
//
//   embedding_checkpoint_bench --dir=DIR [--rows=N] [--dim=D] [--touched=F,F...]
//
// A job of one Adagrad table holds N rows (created by lookups and trained
// once). It is saved whole; then, for each fraction F, F * N rows (drawn
// at random) are trained again and the table is saved incrementally on the
// save before (a chain: whole, F1, F2, ...), and saved whole at that point
// too: the peer, in the same run. For each: bytes, seconds to save, and
// seconds to restore (Load of the chain against Load of the whole file) into
// a new store, each the median of --reps. Checks that the two restores hold
// the same rows (a Save of each, read back and hashed row by row). Prints a
// table and, as its last line, one JSON object.
#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "embedding/embedding_files.h"
#include "embedding/embedding_store.h"

ABSL_FLAG(std::string, dir, "", "Where the checkpoint files go (removed after).");
ABSL_FLAG(int64_t, rows, 2000000, "Rows the table holds.");
ABSL_FLAG(int, dim, 16, "The table's dim.");
ABSL_FLAG(std::string, touched, "0.01,0.1,0.5", "Fractions of the rows trained between two checkpoints.");
ABSL_FLAG(int, reps, 3, "Each save and load timed this many times; the medians are reported.");

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

InitEmbeddingsRequest Init(uint64_t attempt, int dim) {
  InitEmbeddingsRequest r;
  r.set_job("bench");
  r.set_attempt(attempt);
  r.set_num_workers(1);
  r.set_consistency(ASYNC);
  r.set_num_shards(1);
  EmbeddingTableConfig* t = r.add_tables();
  t->set_name("t");
  t->set_dim(dim);
  t->mutable_optimizer()->set_kind(EmbeddingOptimizer::ADAGRAD);
  t->mutable_optimizer()->set_lr(0.05);
  return r;
}

// Looks up and trains `ids` at `step`, in requests of at most 2^16 ids.
bool Train(EmbeddingStore& store, const std::vector<int64_t>& ids, int64_t step, int dim) {
  for (size_t from = 0; from < ids.size(); from += 1 << 16) {
    const size_t n = std::min<size_t>(1 << 16, ids.size() - from);
    const std::string packed(reinterpret_cast<const char*>(ids.data() + from), n * sizeof(int64_t));
    EmbeddingLookupRequest l;
    l.set_job("bench");
    l.set_attempt(1);
    l.set_step(step);
    l.add_tables()->set_table("t");
    l.mutable_tables(0)->set_ids(packed);
    EmbeddingLookupResponse lr;
    if (!store.Lookup(l, absl::Now() + absl::Seconds(60), &lr).ok()) return false;
    EmbeddingUpdateRequest u;
    u.set_job("bench");
    u.set_attempt(1);
    u.set_step(step);
    u.add_tables()->set_table("t");
    u.mutable_tables(0)->set_ids(packed);
    std::vector<float> grads(n * dim, 0.01f);
    u.add_grads(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * sizeof(float)));
    if (!store.Update(u).ok()) return false;
  }
  return true;
}

// Seconds to Load `chain` into a new store; its rows saved whole to `out`.
double Restore(const std::vector<std::vector<std::string>>& chain, int dim, const std::string& out, bool* ok) {
  EmbeddingStore store({});
  const auto start = Clock::now();
  *ok = store.Load(Init(2, dim), chain, 1).ok();
  const double seconds = Since(start);
  *ok = *ok && store.Save("bench", 2, out).ok();
  return seconds;
}

uint64_t Bytes(const std::string& path) { return std::filesystem::file_size(path); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// An order-free digest of a file's rows (id, value, slots, last step, count).
absl::StatusOr<uint64_t> Digest(const std::string& path) {
  auto tables = ReadEmbeddingFiles({{path}});
  if (!tables.ok()) return tables.status();
  uint64_t sum = 0;
  const EmbeddingTable& t = *(*tables)[0];
  absl::Status s = t.ForEachRow([&](const EmbeddingRowView& r) {
    uint64_t h = std::hash<std::string>()(std::string(reinterpret_cast<const char*>(r.value), 4 * t.dim()) +
                                          std::string(reinterpret_cast<const char*>(r.slots), 4 * t.slot_floats()));
    h ^= static_cast<uint64_t>(r.id) * 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(r.last_step) << 7 ^ r.count;
    sum += h * 0xff51afd7ed558ccdULL;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return sum;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  std::vector<double> touched;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_touched), ',')) {
    double v = 0;
    if (!absl::SimpleAtod(f, &v) || v <= 0 || v > 1) {
      std::fprintf(stderr, "--touched: fractions in (0, 1]\n");
      return 2;
    }
    touched.push_back(v);
  }
  if (dir.empty() || rows < 1 || dim < 1) {
    std::fprintf(stderr, "usage: embedding_checkpoint_bench --dir=DIR [--rows=N] [--dim=D] [--touched=F,...]\n");
    return 2;
  }
  std::filesystem::create_directories(dir);
  EmbeddingStore store({});
  InitEmbeddingsResponse created;
  if (!store.Init(Init(1, dim), &created).ok()) return 1;
  std::vector<int64_t> ids(rows);
  std::mt19937_64 rng(33);
  for (auto& id : ids) id = static_cast<int64_t>(rng());
  std::fprintf(stderr, "filling %lld rows of dim %d ...\n", static_cast<long long>(rows), dim);
  if (!Train(store, ids, 0, dim)) return 1;

  std::vector<std::vector<std::string>> chain = {{dir + "/whole-0.emb"}};
  auto start = Clock::now();
  auto first = store.Save("bench", 1, chain[0][0], 1, 0);
  if (!first.ok()) return 1;
  std::printf("%-9s %14s %9s %14s %9s %10s %10s\n", "touched", "incr. bytes", "save s", "whole bytes", "save s",
              "chain load", "whole load");
  std::printf("%-9s %14s %9s %14llu %9.3f\n", "(first)", "", "", static_cast<unsigned long long>(first->bytes),
              Since(start));
  std::string json = "{\"bench\": \"embckpt\", \"rows\": " + std::to_string(rows) + ", \"dim\": " +
                     std::to_string(dim) + ", \"runs\": [";
  std::map<std::string, double> ratios;
  for (size_t k = 0; k < touched.size(); ++k) {
    std::vector<int64_t> some = ids;
    std::shuffle(some.begin(), some.end(), rng);
    some.resize(static_cast<size_t>(touched[k] * rows));
    if (!Train(store, some, static_cast<int64_t>(k) + 1, dim)) return 1;
    const uint64_t id = k + 2;
    const std::string inc = absl::StrCat(dir, "/incr-", k, ".emb"), whole = absl::StrCat(dir, "/whole-", k + 1, ".emb");
    const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
    std::vector<double> inc_runs, whole_runs, chain_loads, whole_loads;
    absl::StatusOr<EmbeddingFileInfo> a, b;
    for (int rep = 0; rep < reps; ++rep) {  // the same saves again: the same files
      start = Clock::now();
      a = store.Save("bench", 1, inc, id, id - 1);
      inc_runs.push_back(Since(start));
      // The peer: the same moment saved whole (its own id, on no base: the
      // next incremental save stays on `inc`).
      start = Clock::now();
      b = store.Save("bench", 1, whole, 1000 + id, 0);
      whole_runs.push_back(Since(start));
      if (!a.ok() || !b.ok() || !a->incremental) return 1;
    }
    chain.push_back({inc});
    for (int rep = 0; rep < reps; ++rep) {
      bool ok_chain = false, ok_whole = false;
      chain_loads.push_back(Restore(chain, dim, dir + "/check-chain.emb", &ok_chain));
      whole_loads.push_back(Restore({{whole}}, dim, dir + "/check-whole.emb", &ok_whole));
      if (!ok_chain || !ok_whole) return 1;
    }
    // Both restores hold the same rows: their own saves read back alike.
    auto x = Digest(dir + "/check-chain.emb"), y = Digest(dir + "/check-whole.emb");
    if (!x.ok() || !y.ok() || *x != *y) {
      std::fprintf(stderr, "the chain's restore differs from the whole file's\n");
      return 1;
    }
    const double inc_s = Median(inc_runs), whole_s = Median(whole_runs);
    const double chain_load = Median(chain_loads), whole_load = Median(whole_loads);
    std::printf("%-9.3f %14llu %9.3f %14llu %9.3f %10.3f %10.3f\n", touched[k],
                static_cast<unsigned long long>(Bytes(inc)), inc_s, static_cast<unsigned long long>(b->bytes), whole_s,
                chain_load, whole_load);
    json += absl::StrCat(k ? ", " : "", "{\"touched\": ", touched[k], ", \"chain\": ", chain.size(),
                         ", \"incremental_bytes\": ", a->bytes, ", \"incremental_save_s\": ", inc_s,
                         ", \"whole_bytes\": ", b->bytes, ", \"whole_save_s\": ", whole_s,
                         ", \"chain_load_s\": ", chain_load, ", \"whole_load_s\": ", whole_load, "}");
    const std::string at = absl::StrCat(touched[k]);
    ratios["incremental_bytes_vs_whole@" + at] = static_cast<double>(a->bytes) / b->bytes;
    ratios["incremental_save_vs_whole@" + at] = inc_s / whole_s;
    ratios["chain_load_vs_whole@" + at] = chain_load / whole_load;
  }
  json += "], \"ratios\": {";
  bool first_ratio = true;
  for (const auto& [name, v] : ratios) {
    json += absl::StrCat(first_ratio ? "" : ", ", "\"", name, "\": ", v);
    first_ratio = false;
  }
  std::printf("%s}}\n", json.c_str());
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pstrain::Main();
}
