// The coordinator's side of the checkpoint protocol (checkpoint/layout.h
// has the whole exchange): each job's checkpoint state, made explicit, and
// the file and shard work of saving and restoring, which runs outside the
// coordinator's lock on what was decided under it.
#ifndef PSTRAIN_SERVER_COORDINATOR_CHECKPOINT_DRIVER_H_
#define PSTRAIN_SERVER_COORDINATOR_CHECKPOINT_DRIVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "common/job_spec.h"
#include "proto/control.pb.h"
#include "server/coordinator/rendezvous.h"

namespace pstrain {

// One job's checkpoint state. Guarded by the coordinator's mutex.
struct CheckpointState {
  // A checkpoint is claimed (set atomically with the check by whoever
  // starts one, cleared when it ends): at most one runs.
  bool claimed = false;
  // The workers are asked (heartbeat `pause`, with pause_id) to stop at a
  // step boundary; those that did, by rank, with where they stopped.
  bool pause_requested = false;
  int64_t pause_id = 0;  // unique across coordinator lifetimes (NextPauseId)
  std::map<int, CheckpointManifest::Worker> paused;
  int64_t last_step = 0;  // of the newest checkpoint written or restored
  // That checkpoint's directory, in this attempt (empty: none yet): the base
  // of the next incremental embedding checkpoint.
  std::string last_dir;
  // The shards load a checkpoint before the workers get to start; then
  // each worker starts at its position.
  bool restoring = false;
  std::vector<CheckpointManifest::Worker> start_positions;
  // A member is leaving: checkpoint, then requeue.
  bool draining = false;

  // The checkpoint ended (saved or not): the workers go on.
  void EndPause() {
    claimed = false;
    pause_requested = false;
    paused.clear();
  }
  // The job was requeued: nothing of its attempt is left in flight.
  void Reset() {
    EndPause();
    draining = false;
    restoring = false;  // a late restore result finds nothing to end
    last_dir.clear();   // the new attempt's shards hold none of its rows
    start_positions.clear();
  }
};

// Whether the spec's periodic checkpoint is due for a job in this state.
bool PeriodicCheckpointDue(const JobStatus& status, const JobSpec& spec, const CheckpointState& checkpoint);

// The shards' addresses in rank order, from a job's member list (a lost
// shard of a replicated job keeps its place: routings index shards).
std::vector<std::string> ShardAddresses(const JobStatus& status);
// Whether `m` is a shard the job declared lost (replicated shards).
bool ShardLost(const JobStatus& status, const MemberStatus& m);

// What one checkpoint writes, decided under the coordinator's lock.
struct CheckpointWrite {
  std::string job_id;
  uint64_t attempt = 0;
  std::string job_secret;  // sent to the shards with every call
  int64_t pause_id = 0;
  // No shards: worker 0 writes its local store, told where and answering
  // through the job's rendezvous store.
  bool allreduce = false;
  // All-reduce: how many workers write (a pipelined job: worker s writes
  // stage s's store to shard-<s>.bin, so the files are a shard checkpoint
  // of the whole model that any cut, or none, restores by key).
  int stages = 1;
  std::vector<std::string> shards;  // addresses, by rank
  // Embeddings: every shard also writes the job's embedding tables
  // (SaveEmbeddings) to emb-<rank>.bin, beside its dense shard file (a
  // hybrid job, `allreduce` too: beside worker 0's).
  bool embeddings = false;
  // checkpoint_incremental: up to this many incremental embedding
  // checkpoints follow a whole one; each is incremental on `base_dir` (the
  // newest checkpoint of the attempt, written or restored) when that one's
  // chain is shorter. Shards that cannot vouch for it write whole files.
  int incremental = 0;
  std::string base_dir;
  // QAT: worker 0 also writes the model's buffers (its quantizers) to
  // buffers.pt, told where and answering through the rendezvous.
  bool buffers = false;
  std::string dir;                  // ckpt-<step>, absolute, under the root
  int keep = 1;                     // newest checkpoints kept
  CheckpointManifest manifest;      // all but the shards' files
  // How long the shards (or worker 0) may take to write their tables
  // (CoordinatorOptions::checkpoint_save_timeout).
  absl::Duration save_timeout = absl::Minutes(10);
  // Asked while the shards write (a few times a second): a reason to give
  // up (one of them was declared lost, the job ended) or empty. The calls
  // still in flight are cancelled and the checkpoint fails with ABORTED
  // naming it, instead of waiting out save_timeout on a shard that hangs.
  std::function<std::string()> abandon;
};

// All-reduce worker 0's answer under ckpt/<id>/saved (checkpoint/
// pause_keys.h): a WorkerSaveReport in binary form. The file it saved, or
// INTERNAL saying why not: the error it reported, or that the value is no
// such report (any bytes give a status, never a crash).
absl::StatusOr<SaveTableResponse> ParseWorkerSaveReport(const std::string& value);

// Has every shard (or worker 0) write its table (and, `embeddings`, its
// embedding tables: all the shards' calls at once) into the pending
// directory, writes the manifest, and commits the directory whole (older
// ones beyond `keep` go). On any failure nothing is left behind.
// `embeddings` (may be null) gets what the shards wrote of the embedding
// tables ("incremental on ckpt-40: 1200 rows whole, 98800 by id"), for
// the checkpoint's event; empty for a job without them.
absl::Status WriteCheckpoint(const CheckpointWrite& write, const std::string& root, Rendezvous& rendezvous,
                             std::string* embeddings = nullptr);

// Loads the checkpoint in `dir` into a job's (new) shards, cut by a fresh
// partition plan for their number; returns its manifest. All-reduce jobs
// (no shards) only read the manifest: the workers load the file; so do a
// hybrid job's (all-reduce with embeddings), whose shards load only rows. A job
// with embeddings (spec.embeddings) has every new shard load every
// embedding file of the checkpoint (LoadEmbeddings keeps the rows it owns
// under the new shard count), continuing at the checkpoint's step; a
// checkpoint without embedding files cannot restore such a job.
// `table_grant`: the coordinator's grant for the job's attempt and secret
// (empty without a grant key). `timeout`: each shard's LoadTable call
// (CoordinatorOptions::checkpoint_load_timeout).
absl::StatusOr<CheckpointManifest> LoadCheckpoint(const std::string& job_id, uint64_t attempt,
                                                  const std::string& job_secret, const std::string& table_grant,
                                                  const std::string& dir,
                                                  const JobSpec& spec, const std::vector<std::string>& shards,
                                                  const std::string& root, absl::Duration timeout);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_CHECKPOINT_DRIVER_H_
