// A dlrm job's embedding tables go into its checkpoints and come back on a
// restore, onto another number of shards -- real processes throughout (a
// coordinator, 3 pstrain-ps shards, 2 pstrain-worker processes, the CLI):
//
// 1. A dlrm job (26 Adagrad tables, 2 shards, 2 workers, ASYNC) with
//    checkpoint_every_steps writes a periodic checkpoint; its manifest lists
//    one embedding file per shard beside the dense shard files. It is then
//    cancelled.
// 2. `pstrain restore` of that checkpoint onto 3 shards, the workers held
//    (SIGSTOP) so that nothing trains: once the job reports it was restored,
//    each new shard is asked to save what it holds, and the rows the three
//    hold together are the checkpoint's rows -- every id of every table, its
//    value, its Adagrad slots, its last step and count, bit for bit.
// 3. The workers go on: the restored job trains past the checkpoint to its
//    max_steps and reports a test AUC well above chance; each rank started
//    at its checkpointed step, and its epoch ended where its share of the
//    file does (the batches it had trained were skipped, not trained again).
// And `pstrain export --embeddings` writes a checkpoint's tables for
// PyTorch; a shard leaving (SIGTERM) checkpoints a dlrm job, which resumes
// on the others.
// Left out, the coordinator's SaveEmbeddings (no embedding files: the
// restore fails) or its LoadEmbeddings (the new shards hold no tables)
// fails this test.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <vector>

#include "absl/synchronization/notification.h"
#include "checkpoint/manifest.h"
#include "embedding/embedding_files.h"
#include "embedding/embedding_table.h"
#include "embedding/row_math.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_embedding_client.h"
#include "server/coordinator/job_store.h"
#include "tests/checkpoint_values.h"
#include "tests/control_plane_testing.h"
#include "worker/criteo_synth.h"

namespace pstrain {
namespace {

// 40000 training examples, every other one a rank's: 20000, 313 batches of 64.
constexpr int64_t kBatchesPerEpoch = (20000 + 63) / 64;
constexpr int64_t kLogEvery = 5;
constexpr int kDim = 8;

// A worker's progress events, from its log (JSON lines; proto3 leaves out
// a rank of 0).
struct Progress {
  int rank = 0;
  int epoch = 0;  // from 0, as a checkpoint counts
  int64_t step = 0;
};
std::vector<Progress> ProgressLines(const std::string& log) {
  std::vector<Progress> out;
  const std::regex step("\"progress\":\\{.*\"step\":\"(\\d+)\""), rank("^\\{\"rank\":(\\d+)"),
      epoch("\"progress\":\\{\"epoch\":(\\d+)");
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, step)) continue;
    Progress p;
    p.step = std::stoll(m[1]);
    if (std::regex_search(line, m, rank)) p.rank = std::stoi(m[1]);
    if (std::regex_search(line, m, epoch)) p.epoch = std::stoi(m[1]) - 1;  // the event counts from 1
    out.push_back(p);
  }
  return out;
}

std::string SpecYaml(int shards, const std::string& extra, const std::string& data = "criteo") {
  std::string yaml =
      "name: ctr\nmodel: dlrm\ndata: {format: criteo, dir: " + data +
      ", train_file: train.tsv, test_file: test.tsv}\n"
      "workers: 2\nshards: " +
      std::to_string(shards) + "\nconsistency: async\nbatch_size: 64\nlog_every_steps: " + std::to_string(kLogEvery) +
      "\noptimizer: {kind: adagrad, lr: 0.02}\nembeddings:\n  tables:\n";
  for (int t = 0; t < kCriteoSparseFields; ++t) {
    yaml += "    - {name: c" + std::to_string(t) + ", dim: " + std::to_string(kDim) +
            ", optimizer: {kind: adagrad, lr: 0.05}}\n";
  }
  return yaml + extra;
}

// An incremental checkpoint's chain (the newest last; `files` as
// ReadEmbeddingRows takes them, `saved` their rows): kept beside the newest
// two by retention; the newest smaller than its rows written whole (the
// rarer ids were not all touched); the rows moved on from the whole one.
void ExpectIncrementalChain(const std::vector<EmbeddingChainLink>& chain, const CheckpointManifest& manifest,
                            const EmbeddingRows& saved, const std::vector<std::vector<std::string>>& files) {
  auto whole = ReadManifest(chain[0].dir);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto bytes = [](const CheckpointManifest& m) {
    uint64_t b = 0;
    for (const auto& f : m.embeddings) b += f.bytes;
    return b;
  };
  size_t held = 0;
  for (const auto& [name, table] : saved) held += table.size();
  // A row written whole: id, last step, count, value and Adagrad slots.
  const uint64_t whole_row = 8 + 8 + 4 + 2 * kDim * sizeof(float);
  for (size_t k = 1; k < chain.size(); ++k) {
    auto link = ReadManifest(chain[k].dir);
    ASSERT_TRUE(link.ok()) << link.status();
    std::printf("embedding checkpoint %s: %llu bytes, incremental on %s (the whole one: %llu bytes)\n",
                chain[k].dir.c_str(), static_cast<unsigned long long>(bytes(*link)),
                link->embeddings_base.c_str(), static_cast<unsigned long long>(bytes(*whole)));
  }
  std::printf("the newest holds %zu rows: %llu bytes whole\n", held,
              static_cast<unsigned long long>(held * whole_row));
  EXPECT_LT(bytes(manifest), held * whole_row * 3 / 4) << "the newest wrote most of its rows whole";
  auto base_rows = ReadEmbeddingRows({files.front()});
  ASSERT_TRUE(base_rows.ok()) << base_rows.status();
  EXPECT_NE(EmbeddingRowDifference(saved, *base_rows), "");
}

class CheckpointEmbeddingsTest : public ControlPlaneTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("ckpt-emb");
    // Leases of 30 s: the workers are stopped for a few seconds below and
    // must keep their places.
    missed_heartbeats_ = 300;
    CriteoSynthOptions o;
    o.train_examples = 40000;
    o.test_examples = 5000;
    o.id_space.fill(50);
    std::filesystem::create_directories(dir_ + "/data/criteo");
    auto meta = WriteCriteoSynth(o, dir_ + "/data/criteo/train.tsv", dir_ + "/data/criteo/test.tsv", "");
    ASSERT_TRUE(meta.ok()) << meta.status();
    StartCoordinator(0);
    StartPool(3, 0);
    for (int r = 0; r < 2; ++r) {
      const std::string name = "worker-" + std::to_string(r);
      workers_.push_back(pool_.size());
      pool_.push_back(Start(name, {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=" + name,
                                   "--data_root=" + dir_ + "/data"}));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Cli({"cluster"}).out.find("worker-1") == std::string::npos) {
      ASSERT_LT(absl::Now(), deadline) << Cli({"cluster"}).out;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  std::string WriteSpec(const std::string& name, const std::string& yaml) {
    const std::string path = dir_ + "/" + name + ".yaml";
    EXPECT_TRUE(WriteFileAtomically(path, yaml).ok());
    return path;
  }

  // The job's newest checkpoint (its status's last_checkpoint), once it has one.
  std::string WaitForCheckpoint(const std::string& job, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      CliResult st = Cli({"status", job, "-o", "json"});
      std::smatch m;
      if (std::regex_search(st.out, m, std::regex("\"last_checkpoint\": \"([^\"]+)\""))) return m[1];
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "no checkpoint of " << job << ": " << Cli({"status", job}).out << Logs();
    return "";
  }

  // The job as the coordinator stored it: its secret and its shards.
  absl::StatusOr<StoredJob> Stored(const std::string& job) {
    absl::Status last = absl::NotFoundError(job);
    for (int tries = 0; tries < 50; ++tries) {  // the coordinator may hold the database a moment
      auto store = JobStore::Open(dir_ + "/jobs.db");
      if (store.ok()) {
        auto jobs = (*store)->List();
        if (jobs.ok()) {
          for (StoredJob& j : *jobs) {
            if (j.id == job) return std::move(j);
          }
        } else {
          last = jobs.status();
        }
      } else {
        last = store.status();
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return last;
  }

  // An open-ended job on 2 shards, checkpointed every 40 steps, cancelled
  // after its first checkpoint: its id and that checkpoint's directory.
  // `mode`: spec lines such as "mode: allreduce\n" (hybrid). With
  // incremental_: after the first checkpoint that many links incremental on
  // a whole one.
  void CheckpointThenCancel(std::string* job, std::string* ck, const std::string& mode = "") {
    *job = Submit(WriteSpec("a", SpecYaml(2, mode + "epochs: 1000\ncheckpoint_every_steps: 40\n" + incremental_spec(),
                                          data_)));
    const absl::Time deadline = absl::Now() + absl::Seconds(240);
    do {
      *ck = WaitForCheckpoint(*job, absl::Seconds(180));
      ASSERT_FALSE(ck->empty());
      auto m = ReadManifest(*ck);
      if (m.ok() && m->embeddings_chain == incremental_) break;
      ASSERT_LT(absl::Now(), deadline) << "no checkpoint " << incremental_ << " links from a whole one: " << *ck;
      absl::SleepFor(absl::Milliseconds(100));
    } while (true);
    ASSERT_EQ(Cli({"cancel", *job}).code, 0);
    WaitForState(*job, "CANCELLED", absl::Seconds(60));
  }

  // checkpoint_incremental: 2 on data whose 13 wider fields (20,000 Zipf
  // ids each) a few steps do not all touch.
  void UseIncrementalCheckpoints() {
    CriteoSynthOptions o;
    o.train_examples = 40000;  // kBatchesPerEpoch
    o.test_examples = 5000;
    o.id_space.fill(50);
    for (int f = kCriteoSparseFields / 2; f < kCriteoSparseFields; ++f) o.id_space[f] = 20000;
    std::filesystem::create_directories(dir_ + "/data/criteo_wide");
    auto meta =
        WriteCriteoSynth(o, dir_ + "/data/criteo_wide/train.tsv", dir_ + "/data/criteo_wide/test.tsv", "");
    ASSERT_TRUE(meta.ok()) << meta.status();
    data_ = "criteo_wide";
    incremental_ = 2;
    min_auc_ = 0.6;  // the rarer ids learn slower (Bayes AUC of this data, printed)
    std::printf("criteo_wide: Bayes AUC %.4f\n", meta->bayes_auc);
  }

  void RestoreOntoThreeShardsAndTrainOn(const std::string& mode, const std::string& into_mode);
  // The spec lines of incremental checkpoints (none without incremental_;
  // checkpoint_keep 2: a later checkpoint leaves the one waited for).
  std::string incremental_spec() const {
    return incremental_ == 0 ? ""
                             : "checkpoint_incremental: " + std::to_string(incremental_) + "\ncheckpoint_keep: 2\n";
  }
  std::vector<size_t> workers_;  // indexes into pool_
  int incremental_ = 0;
  std::string data_ = "criteo";  // under --data_root
  double min_auc_ = 0.65;        // after the restored job's steps
};

// A job of `mode` (spec lines) checkpointed on 2 shards is restored onto 3
// as a job of `into_mode`: they hold the checkpoint's rows, and each rank
// trains on from its place.
void CheckpointEmbeddingsTest::RestoreOntoThreeShardsAndTrainOn(const std::string& mode,
                                                                const std::string& into_mode) {
  // 1. Checkpointed every 40 steps, open-ended until cancelled.
  std::string job, ck;
  ASSERT_NO_FATAL_FAILURE(CheckpointThenCancel(&job, &ck, mode));
  auto manifest = ReadManifest(ck);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(manifest->embeddings.size(), 2u) << "one embedding file per shard";
  // The dense part: each shard's table, or (hybrid) worker 0's.
  ASSERT_EQ(manifest->shards.size(), mode.empty() ? 2u : 1u);
  ASSERT_GE(manifest->step, 40);
  auto chain = EmbeddingChain(ck, *manifest);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), static_cast<size_t>(incremental_ + 1)) << "the chain back to a whole checkpoint";
  std::vector<std::vector<std::string>> files;
  for (const EmbeddingChainLink& link : *chain) files.push_back(link.files);
  auto saved = ReadEmbeddingRows(files);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->size(), 26u);
  if (incremental_ > 0) {
    ASSERT_NO_FATAL_FAILURE(ExpectIncrementalChain(*chain, *manifest, *saved, files));
    // The job's events say what each checkpoint wrote of the tables.
    const std::string events = Cli({"status", job, "-o", "json"}).out;
    EXPECT_NE(events.find("(embeddings incremental on " + manifest->embeddings_base + ": "), std::string::npos)
        << events;
    EXPECT_NE(events.find("(embeddings whole: "), std::string::npos) << events;
  }
  size_t rows = 0;
  for (const auto& [name, table] : *saved) rows += table.size();
  EXPECT_GT(rows, 26u * 20) << "the checkpoint holds the trained rows";

  // 2. Restored onto 3 shards, the workers stopped: nothing trains. They
  // are stopped once free of the cancelled job (a worker holds it until its
  // heartbeat says it stopped), so that the restored job can be assigned.
  const absl::Time freed = absl::Now() + absl::Seconds(30);
  while (Cli({"cluster", "-o", "json"}).out.find(job) != std::string::npos) {
    ASSERT_LT(absl::Now(), freed) << Cli({"cluster"}).out;
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (size_t w : workers_) pool_[w]->Signal(SIGSTOP);
  const int64_t max_steps = manifest->step + 300;
  const std::string spec_b =
      WriteSpec("b", SpecYaml(3, into_mode + "epochs: 1000\nmax_steps: " + std::to_string(max_steps) + "\n", data_));
  CliResult r = Cli({"restore", "--from", ck, "--spec", spec_b, "--output_dir", dir_ + "/out"});
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string restored = r.out.substr(0, r.out.find('\n'));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Cli({"status", restored, "-o", "json"}).out.find(" loaded from " + ck) == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << Cli({"status", restored}).out << Logs();
    absl::SleepFor(absl::Milliseconds(100));
  }
  auto stored = Stored(restored);
  ASSERT_TRUE(stored.ok()) << stored.status();
  std::vector<std::string> probes;
  for (const MemberStatus& m : stored->status.members()) {
    if (m.role() != MEMBER_ROLE_SHARD) continue;
    // In the job's directory under the shards' checkpoint root (dir_).
    const std::string name = "probe/" + restored + "/emb-" + std::to_string(m.rank()) + ".bin";
    std::filesystem::create_directories(dir_ + "/probe/" + restored);
    SaveEmbeddingsRequest req;
    req.set_job(restored);
    req.set_attempt(stored->status.attempt());
    req.set_path(name);
    SaveEmbeddingsResponse resp;
    absl::Notification done;
    absl::Status s;
    SaveEmbeddingsAsync(CreateChannel(m.address()), req, stored->status.job_secret(), absl::Now() + absl::Seconds(30),
                        &resp, [&](absl::Status status) {
                          s = status;
                          done.Notify();
                        });
    done.WaitForNotification();
    ASSERT_TRUE(s.ok()) << "shard " << m.rank() << ": " << s;
    probes.push_back(dir_ + "/" + name);
  }
  ASSERT_EQ(probes.size(), 3u);
  auto loaded = ReadEmbeddingRows({probes});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(EmbeddingRowDifference(*saved, *loaded), "") << "the restored shards do not hold the checkpoint's rows";

  // 3. It trains on to max_steps from there. What the workers log from now
  // on is the restored job's.
  std::map<std::string, size_t> offsets;
  for (const char* name : {"worker-0", "worker-1"}) {
    offsets[name] = ReadFile(dir_ + "/" + name + ".log").value_or("").size();
  }
  for (size_t w : workers_) pool_[w]->Signal(SIGCONT);
  CliResult watch = Cli({"watch", restored}, absl::Seconds(300));
  ASSERT_EQ(watch.code, 0) << watch.out << Logs();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(watch.out, m, std::regex("final test AUC ([0-9.]+)"))) << watch.out;
  std::printf("restored dlrm job: final test AUC %s after steps %lld..%lld\n", m[1].str().c_str(),
              static_cast<long long>(manifest->step), static_cast<long long>(max_steps));
  EXPECT_GT(std::stod(m[1]), min_auc_) << watch.out;  // chance 0.5; the example reaches 0.74

  // Each rank went on from its place: its first step was the checkpoint's
  // next, and its epoch ended where its share of the file did -- the
  // batches it trained before the checkpoint were skipped, not trained again.
  std::map<int, std::vector<Progress>> progress;
  for (const auto& [name, offset] : offsets) {
    for (const Progress& p : ProgressLines(ReadFile(dir_ + "/" + name + ".log").value_or("").substr(offset))) {
      progress[p.rank].push_back(p);
    }
  }
  ASSERT_EQ(progress.size(), 2u) << Logs();
  for (const CheckpointManifest::Worker& w : manifest->workers) {
    SCOPED_TRACE("rank " + std::to_string(w.rank));
    const std::vector<Progress>& seen = progress[w.rank];
    ASSERT_FALSE(seen.empty());
    EXPECT_GT(seen.front().step, w.step);
    EXPECT_LE(seen.front().step, w.step + kLogEvery) << "the rank did not resume at its checkpointed step";
    EXPECT_EQ(seen.front().epoch, w.epoch);
    const int64_t next_epoch = w.step + (kBatchesPerEpoch - w.epoch_step);  // its first step
    if (next_epoch + kLogEvery > max_steps) continue;
    auto first = std::find_if(seen.begin(), seen.end(), [&](const Progress& p) { return p.epoch > w.epoch; });
    ASSERT_NE(first, seen.end());
    EXPECT_GT(first->step, next_epoch) << "epoch " << w.epoch << " did not end where the rank's share did";
    EXPECT_LE(first->step, next_epoch + kLogEvery) << "epoch " << w.epoch << " did not end where the rank's share did";
  }
}

TEST_F(CheckpointEmbeddingsTest, ARestoreOntoAnotherShardCountHoldsTheCheckpointsRowsAndTrainsOn) {
  RestoreOntoThreeShardsAndTrainOn("", "");
}

// Hybrid: the dense part all-reduced (worker 0 saves it, the workers load
// it), the rows on the shards (they save and load them).
TEST_F(CheckpointEmbeddingsTest, AHybridJobsCheckpointRestoresOntoAnotherShardCountAndTrainsOn) {
  RestoreOntoThreeShardsAndTrainOn("mode: allreduce\n", "mode: allreduce\n");
}

// checkpoint_incremental: 2 on data whose rarer ids a few steps do not all
// touch. The third checkpoint is incremental on the second, itself on the
// first (kept by retention, though checkpoint_keep is 2); a restore onto 3
// shards holds the rows the chain reads back, and trains on.
TEST_F(CheckpointEmbeddingsTest, AnIncrementalCheckpointsChainRestoresOntoAnotherShardCount) {
  ASSERT_NO_FATAL_FAILURE(UseIncrementalCheckpoints());
  RestoreOntoThreeShardsAndTrainOn("", "");
}

// The same in a hybrid job: worker 0 writes the dense part whole each
// time, the shards their rows incrementally.
TEST_F(CheckpointEmbeddingsTest, AHybridJobsIncrementalChainRestoresOntoAnotherShardCount) {
  ASSERT_NO_FATAL_FAILURE(UseIncrementalCheckpoints());
  RestoreOntoThreeShardsAndTrainOn("mode: allreduce\n", "mode: allreduce\n");
}

// Across modes: a ps job's checkpoint (dense part on the shards) restored
// as a hybrid job (its workers load the dense part, re-cut from the
// manifest's parameter list; the shards the rows).
TEST_F(CheckpointEmbeddingsTest, APsJobsCheckpointRestoresIntoAHybridJob) {
  RestoreOntoThreeShardsAndTrainOn("", "mode: allreduce\n");
}

// And back: a hybrid job's checkpoint (dense part in worker 0's file)
// restored as a ps job (the new shards load the dense part from it).
TEST_F(CheckpointEmbeddingsTest, AHybridJobsCheckpointRestoresIntoAPsJob) {
  RestoreOntoThreeShardsAndTrainOn("mode: allreduce\n", "");
}

// `pstrain export JOB --embeddings FILE` writes the tables of the job's
// newest checkpoint as torch.load reads them: PyTorch finds every row of
// the checkpoint's files with its value.
TEST_F(CheckpointEmbeddingsTest, ExportWritesTheNewestCheckpointsTablesForPyTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is missing (make setup installs it)";
  }
  std::string job, ck;
  ASSERT_NO_FATAL_FAILURE(CheckpointThenCancel(&job, &ck));
  auto manifest = ReadManifest(ck);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::vector<std::string> files;
  for (const auto& f : manifest->embeddings) files.push_back(ck + "/" + f.file);
  auto rows = ReadEmbeddingRows({files});
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::string expected;
  for (const auto& [table, by_id] : *rows) {
    for (const auto& [id, bytes] : by_id) {
      expected += "row " + table + " " + std::to_string(id);
      for (int k = 0; k < kDim; ++k) {
        float v;
        std::memcpy(&v, bytes.data() + k * sizeof(float), sizeof(float));
        char buf[32];
        std::snprintf(buf, sizeof(buf), " %.9g", v);
        expected += buf;
      }
      expected += "\n";
    }
  }
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/expected.txt", expected).ok());
  const std::string out = dir_ + "/embeddings.pt";
  CliResult r = Cli({"export", job, "--embeddings", out});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step " + std::to_string(manifest->step)), std::string::npos) << r.out;
  EXPECT_EQ(
      std::system(("/usr/bin/python3 tests/check_embedding_export.py " + out + " " + dir_ + "/expected.txt").c_str()),
      0);
  // A job without a checkpoint has none to export.
  const std::string fresh = Submit(WriteSpec("c", SpecYaml(2, "max_steps: 10\n")));
  WaitForState(fresh, "SUCCEEDED", absl::Seconds(120));
  r = Cli({"export", fresh, "--embeddings", dir_ + "/none.pt"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("has no checkpoint"), std::string::npos) << r.out;
}

// SIGTERM on a shard of a running dlrm job: the coordinator checkpoints it
// (the CTR loop pauses; the shards save dense and embedding tables) while
// the shard still serves, requeues it, and restores it onto the shards left
// (the pool's spare among them); the job trains on to its end.
TEST_F(CheckpointEmbeddingsTest, ADrainedShardsJobResumesFromItsCheckpointOnTheOthers) {
  const std::string job = Submit(WriteSpec("d", SpecYaml(2, "epochs: 1000\nmax_steps: 2000\n")));
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 40));
  std::smatch m;
  const std::string st = Cli({"status", job, "-o", "json"}).out;
  ASSERT_TRUE(std::regex_search(st, m, std::regex("\"name\": \"shard-(\\d)\""))) << st;
  ChildProcess& shard = *pool_[std::stoi(m[1])];  // shard-i is pool_[i]
  shard.Signal(SIGTERM);
  EXPECT_EQ(shard.Wait(absl::Seconds(120)), 0) << Logs();
  EXPECT_GT(WaitUntilRestoredAndTraining(job), 40);
  CliResult watch = Cli({"watch", job}, absl::Seconds(300));
  ASSERT_EQ(watch.code, 0) << watch.out << Logs();
  const std::string done = Cli({"status", job, "-o", "json"}).out;
  EXPECT_NE(done.find("\"reason\": \"CheckpointSaved\""), std::string::npos) << done;
  EXPECT_NE(done.find("\"reason\": \"MemberLeft\""), std::string::npos) << done;
  ASSERT_TRUE(std::regex_search(watch.out, m, std::regex("final test AUC ([0-9.]+)"))) << watch.out;
  EXPECT_GT(std::stod(m[1]), 0.65) << watch.out;
}

}  // namespace
}  // namespace pstrain
