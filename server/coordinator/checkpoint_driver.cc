#include "server/coordinator/checkpoint_driver.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/pause_keys.h"
#include "common/fan_out.h"
#include "common/file_util.h"
#include "common/partition_plan.h"
#include "common/quote.h"
#include "proto/checkpoint.pb.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_remote_shard.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

constexpr char kBuffersFile[] = "buffers.pt";

// Worker 0 of an all-reduce job writes its store to <pending>/shard-0.bin
// while the workers are paused (a pipelined job: worker s its stage's to
// shard-<s>.bin, all at once); the path goes to it, and its answer (the
// file's size and crc32, or an error) comes back, through the rendezvous
// (worker/pause_protocol.h has the worker's side). `buffers`: the model's
// buffers (QAT), worker 0 to buffers.pt under their own keys, in either
// mode. `saved` gets one answer per writer.
absl::Status SaveOnWorkers(const CheckpointWrite& w, const std::string& pending, Rendezvous& rendezvous,
                           std::vector<SaveTableResponse>* saved, bool buffers = false) {
  const int64_t id = w.pause_id;
  const int writers = buffers ? 1 : std::max(1, w.stages);
  for (int s = 0; s < writers; ++s) {
    absl::Status status =
        rendezvous.Set(w.job_id, w.attempt, buffers ? CheckpointBuffersPathKey(id) : CheckpointPathKey(id, s),
                       absl::StrCat(pending, "/", buffers ? kBuffersFile : absl::StrCat("shard-", s, ".bin")));
    if (!status.ok()) return status;
  }
  const absl::Time deadline = absl::Now() + w.save_timeout;
  saved->resize(writers);
  for (int s = 0; s < writers; ++s) {
    absl::StatusOr<std::string> result = rendezvous.Get(
        w.job_id, w.attempt, buffers ? CheckpointBuffersSavedKey(id) : CheckpointSavedKey(id, s), deadline);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat("worker ", s, " did not save",
                                                               buffers ? " its buffers" : "", ": ",
                                                               result.status().message()));
    }
    auto report = ParseWorkerSaveReport(*result);
    if (!report.ok()) return report.status();
    (*saved)[s] = *std::move(report);
  }
  return absl::OkStatus();
}

// The name of shard i's embedding file in a checkpoint directory.
std::string EmbeddingFileName(size_t i) { return absl::StrCat("emb-", i, ".bin"); }

// The checkpoint a new one's embedding files are incremental on: the
// attempt's newest (CheckpointWrite::base_dir) when the spec allows one
// more link in its chain; id 0: whole files.
struct IncrementalBase {
  uint64_t id = 0;
  std::string name;  // its directory's, beside the new one
  int chain = 0;     // its own chain's length
};
IncrementalBase ChooseBase(const CheckpointWrite& w) {
  if (!w.embeddings || w.incremental <= 0 || w.base_dir.empty() || w.manifest.id == 0) return {};
  const std::filesystem::path base(w.base_dir), dir(w.dir);
  // Another job's directory, or the same step's (which the new one replaces).
  if (base.parent_path() != dir.parent_path() || base.filename() == dir.filename()) return {};
  auto m = ReadManifest(w.base_dir);
  if (!m.ok() || m->id == 0 || m->embeddings.empty() || m->embeddings_chain >= w.incremental) return {};
  return {m->id, base.filename().string(), m->embeddings_chain};
}

// How often SaveOnShards asks CheckpointWrite::abandon.
constexpr absl::Duration kAbandonPoll = absl::Milliseconds(100);

// Every shard writes its table (unless `dense` is false: a hybrid job's
// dense part is worker 0's) and its embedding tables at once; the first
// failure is returned once every call has ended, or ABORTED once
// w.abandon gives a reason (the calls in flight cancelled).
absl::Status SaveOnShards(const CheckpointWrite& w, const std::string& pending_name, bool dense, uint64_t base_id,
                          std::vector<SaveTableResponse>& saved, std::vector<SaveEmbeddingsResponse>& embeddings) {
  // This checkpoint's own clients and contexts: cancelling them touches no
  // other call to the shards.
  std::vector<std::shared_ptr<grpc::ClientContext>> embedding_calls;
  std::vector<std::unique_ptr<GrpcRemoteShard>> dense_clients;
  FanOut calls;
  if (dense) calls.Add(static_cast<int>(w.shards.size()));
  if (w.embeddings) {
    embeddings.resize(w.shards.size());
    calls.Add(static_cast<int>(w.shards.size()));
    for (size_t i = 0; i < w.shards.size(); ++i) {
      SaveEmbeddingsRequest req;
      req.set_job(w.job_id);
      req.set_attempt(w.attempt);
      req.set_path(absl::StrCat(pending_name, "/", EmbeddingFileName(i)));
      req.set_checkpoint_id(w.manifest.id);
      req.set_base_id(base_id);
      embedding_calls.push_back(SaveEmbeddingsAsync(
          CreateChannel(w.shards[i]), req, w.job_secret, absl::Now() + w.save_timeout, &embeddings[i],
          [&calls, i](absl::Status s) {
            calls.Done(s.ok() ? s : absl::Status(s.code(), absl::StrCat("shard ", i, "'s embeddings: ", s.message())));
          }));
    }
  }
  for (size_t i = 0; dense && i < w.shards.size(); ++i) {
    RemoteShardOptions ro;
    ro.target = w.shards[i];
    SaveTableRequest req;
    req.set_job(w.job_id);
    req.set_path(absl::StrCat(pending_name, "/shard-", i, ".bin"));
    req.set_attempt(w.attempt);
    CallOptions opts;
    opts.deadline = absl::Now() + w.save_timeout;
    opts.job_secret = w.job_secret;
    dense_clients.push_back(std::make_unique<GrpcRemoteShard>(ro));
    dense_clients.back()->SaveTableAsync(req, &saved[i], opts, [&, i](absl::Status s) {
      calls.Done(s.ok() ? s : absl::Status(s.code(), absl::StrCat("shard ", i, ": ", s.message())));
    });
  }
  std::string abandoned;
  while (!calls.Settled(kAbandonPoll)) {
    if (!w.abandon || !(abandoned = w.abandon()).empty()) break;
  }
  if (!abandoned.empty()) {
    for (const auto& context : embedding_calls) context->TryCancel();
    for (const auto& client : dense_clients) client->CancelCalls();
  }
  absl::Status status = calls.Wait();
  if (abandoned.empty()) return status;
  return absl::AbortedError(absl::StrCat("the checkpoint was abandoned: ", abandoned));
}

// Every new shard loads every embedding file of the checkpoint (`dir`:
// absolute) and of the checkpoints it is incremental on, and keeps its rows,
// continuing at its step.
absl::Status LoadEmbeddingsOnShards(const CheckpointManifest& manifest, const std::string& job_id, uint64_t attempt,
                                    const std::string& job_secret, const std::string& root, const std::string& dir,
                                    const JobSpec& spec, const std::vector<std::string>& shards,
                                    absl::Duration timeout) {
  auto chain = EmbeddingChain(dir, manifest);
  if (!chain.ok()) return chain.status();
  LoadEmbeddingsRequest req;
  InitEmbeddingsRequest& init = *req.mutable_init();
  init.set_job(job_id);
  init.set_attempt(attempt);
  init.set_num_workers(static_cast<uint32_t>(spec.workers));
  init.set_consistency(spec.consistency);
  init.set_staleness(spec.staleness);
  init.set_num_shards(static_cast<uint32_t>(shards.size()));
  for (const EmbeddingTableConfig& t : spec.embeddings.tables) *init.add_tables() = t;
  if (spec.replicas > 0) {  // every copy of each slot loads it, as the workers will ask
    init.set_replicas(static_cast<uint32_t>(spec.replicas));
    for (const std::string& t : shards) init.mutable_routing()->add_targets(t);
  }
  for (size_t k = 0; k < chain->size(); ++k) {
    auto* paths = k + 1 < chain->size() ? req.add_bases()->mutable_paths() : req.mutable_paths();
    for (const std::string& f : (*chain)[k].files) paths->Add(RelativeToRoot(root, f));
  }
  req.set_start_step(manifest.step);
  for (size_t i = 0; i < shards.size(); ++i) {
    init.set_shard_index(static_cast<uint32_t>(i));
    absl::Status s = LoadEmbeddings(CreateChannel(shards[i]), req, job_secret, absl::Now() + timeout);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("shard ", i, "'s embeddings: ", s.message()));
  }
  return absl::OkStatus();
}

// Every new shard loads its chunks of the dense tables (a fresh partition
// plan for their number; `dir` relative to the root).
absl::Status LoadDenseOnShards(const CheckpointManifest& manifest, const std::string& job_id, uint64_t attempt,
                               const std::string& job_secret, const std::string& table_grant, const std::string& dir,
                               const JobSpec& spec, const std::vector<std::string>& shards, absl::Duration timeout) {
  auto plan =
      MakePartitionPlan(manifest.params, spec.shards, static_cast<size_t>(manifest.chunk_bytes), spec.replicas);
  if (!plan.ok()) return plan.status();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::shared_ptr<GrpcRemoteShard> client = SharedRemoteShard(RemoteShardOptions{shards[i]});
    // A replicated table: the shard's primaries and backups, in chunk
    // order, each with its copies (as a worker's InitTable would).
    std::vector<size_t> ids = plan->shard_chunks[i];
    if (plan->replicas > 0) {
      ids.insert(ids.end(), plan->shard_backup_chunks[i].begin(), plan->shard_backup_chunks[i].end());
      std::sort(ids.begin(), ids.end());
    }
    std::vector<std::string> keys;
    for (size_t idx : ids) keys.push_back(plan->chunks[idx].key);
    LoadTableRequest req = RestoreRequest(manifest, dir, job_id, attempt, MakeTableConfig(spec), keys);
    if (plan->replicas > 0) {
      req.set_shard(static_cast<uint32_t>(i));
      for (const std::string& t : shards) req.mutable_routing()->add_targets(t);
      for (size_t idx : ids) {
        auto* copies = req.add_copies()->mutable_shards();
        copies->Add(plan->chunks[idx].shard);
        for (int b : plan->chunks[idx].backups) copies->Add(b);
      }
    }
    LoadTableResponse resp;
    CallOptions opts;
    opts.deadline = absl::Now() + timeout;
    opts.job_secret = job_secret;
    opts.table_grant = table_grant;
    absl::Status s = WaitFor([&](StatusCallback done) { client->LoadTableAsync(req, &resp, opts, done); });
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("shard ", i, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SaveTableResponse> ParseWorkerSaveReport(const std::string& value) {
  WorkerSaveReport report;
  // Any bytes parse or fail cleanly; a worker (or whoever wrote the key)
  // cannot make the coordinator throw or abort.
  if (!report.ParseFromString(value)) {
    return absl::InternalError(absl::StrCat("worker 0: not a saved-file report (", value.size(),
                                            " bytes): ", Quote(value, 1024)));
  }
  switch (report.result_case()) {
    case WorkerSaveReport::kSaved:
      return std::move(*report.mutable_saved());
    case WorkerSaveReport::kError:
      return absl::InternalError(absl::StrCat("worker 0: ", Quote(report.error(), 1024)));
    case WorkerSaveReport::RESULT_NOT_SET:
      break;
  }
  return absl::InternalError("worker 0: the saved-file report names neither a file nor an error");
}

bool PeriodicCheckpointDue(const JobStatus& st, const JobSpec& spec, const CheckpointState& c) {
  if (st.state() != RUNNING || c.claimed || c.restoring || spec.checkpoint_every_steps <= 0 ||
      st.params_size() == 0 || st.workers_size() < spec.workers) {
    return false;
  }
  // A dlrm job streams its data: its steps are unknown (0) without max_steps.
  const bool steps_left = st.step() < st.steps() || (st.steps() == 0 && !spec.embeddings.empty());
  return st.step() >= c.last_step + spec.checkpoint_every_steps && steps_left;
}

std::vector<std::string> ShardAddresses(const JobStatus& status) {
  std::vector<std::pair<int, std::string>> by_rank;
  for (const MemberStatus& m : status.members()) {
    if (m.role() == MEMBER_ROLE_SHARD) by_rank.emplace_back(m.rank(), m.address());
  }
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::string> out;
  for (auto& [rank, address] : by_rank) out.push_back(std::move(address));
  return out;
}

bool ShardLost(const JobStatus& status, const MemberStatus& m) {
  return m.role() == MEMBER_ROLE_SHARD &&
         std::find(status.lost_shards().begin(), status.lost_shards().end(), m.rank()) != status.lost_shards().end();
}

absl::Status WriteCheckpoint(const CheckpointWrite& w, const std::string& root, Rendezvous& rendezvous,
                             std::string* embedding_summary) {
  const std::string pending = PendingCheckpointDir(w.dir);
  std::error_code ec;
  absl::Status status = PathUnderRoot(root, w.dir, "the checkpoint directory").status();
  if (status.ok()) {
    std::filesystem::remove_all(pending, ec);
    std::filesystem::create_directories(pending, ec);
    if (ec) status = ErrnoToStatus(ec.value(), "cannot create", pending);
  }
  std::vector<SaveTableResponse> saved(w.allreduce ? 0 : w.shards.size());
  std::vector<SaveEmbeddingsResponse> embeddings;
  CheckpointManifest manifest = w.manifest;
  const IncrementalBase base = ChooseBase(w);
  // A hybrid job (all-reduce with embeddings): worker 0 writes the dense
  // part, then the shards their rows. The workers stay paused until the
  // checkpoint ends, so both are of the same step.
  if (status.ok() && w.allreduce) status = SaveOnWorkers(w, pending, rendezvous, &saved);
  if (status.ok() && (!w.allreduce || w.embeddings)) {
    status = SaveOnShards(w, RelativeToRoot(root, pending), /*dense=*/!w.allreduce, base.id, saved, embeddings);
  }
  std::vector<SaveTableResponse> buffers;
  if (status.ok() && w.buffers) status = SaveOnWorkers(w, pending, rendezvous, &buffers, /*buffers=*/true);
  if (status.ok()) {
    for (size_t i = 0; i < saved.size(); ++i) {
      manifest.shards.push_back({static_cast<int>(i), absl::StrCat("shard-", i, ".bin"), saved[i].bytes(),
                                 saved[i].crc32()});
    }
    int64_t whole = 0, unchanged = 0;
    bool incremental = false;
    for (size_t i = 0; i < embeddings.size(); ++i) {
      manifest.embeddings.push_back(
          {static_cast<int>(i), EmbeddingFileName(i), embeddings[i].bytes(), embeddings[i].crc32()});
      incremental |= embeddings[i].incremental();
      whole += embeddings[i].rows();
      unchanged += embeddings[i].unchanged_rows();
    }
    if (incremental) {  // else every shard wrote its rows whole: no base needed
      manifest.embeddings_base = base.name;
      manifest.embeddings_base_id = base.id;
      manifest.embeddings_chain = base.chain + 1;
    }
    if (!embeddings.empty()) {
      const std::string summary =
          absl::StrCat(incremental ? absl::StrCat("incremental on ", base.name) : std::string("whole"), ": ", whole,
                       " rows whole, ", unchanged, " by id");
      spdlog::info("coordinator: {} checkpoint {}: embeddings {}", w.job_id, w.dir, summary);
      if (embedding_summary != nullptr) *embedding_summary = summary;
    }
    if (w.buffers) manifest.buffers.push_back({0, kBuffersFile, buffers[0].bytes(), buffers[0].crc32()});
    status = WriteManifest(pending, manifest);
  }
  // The directory appears whole or not at all; the job's older ones go.
  if (status.ok()) status = CommitCheckpoint(pending, w.dir, w.keep);
  if (!status.ok()) std::filesystem::remove_all(pending, ec);
  return status;
}

absl::StatusOr<CheckpointManifest> LoadCheckpoint(const std::string& job_id, uint64_t attempt,
                                                  const std::string& job_secret, const std::string& table_grant, const std::string& dir,
                                                  const JobSpec& spec, const std::vector<std::string>& shards,
                                                  const std::string& root, absl::Duration timeout) {
  absl::Status status = PathUnderRoot(root, dir, "the checkpoint").status();
  if (!status.ok()) return status;
  auto manifest = ReadManifest(dir);
  if (!manifest.ok() || shards.empty()) return manifest;
  // Before any shard loads anything.
  if (!spec.embeddings.empty() && manifest->embeddings.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir,
                     " holds no embedding tables (was it written by a job without embeddings, "
                     "or by a pstrain older than embedding checkpoints?); a job with embeddings cannot start from it"));
  }
  // A hybrid job's dense part is restored by its workers (from worker 0's
  // file, as an all-reduce job's); its shards load only the rows.
  if (!spec.allreduce()) {
    status = LoadDenseOnShards(*manifest, job_id, attempt, job_secret, table_grant, RelativeToRoot(root, dir), spec,
                               shards, timeout);
    if (!status.ok()) return status;
  }
  if (!spec.embeddings.empty()) {
    status = LoadEmbeddingsOnShards(*manifest, job_id, attempt, job_secret, root, dir, spec, shards, timeout);
    if (!status.ok()) return status;
  }
  return manifest;
}

}  // namespace pstrain
