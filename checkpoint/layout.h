// The checkpoint protocol's files, in one place: where a job's checkpoints
// and weights live, how a checkpoint directory appears whole or not at all,
// which are kept, and how a manifest becomes the LoadTable request that
// restores a table onto any number of shards.
//
// The whole exchange (the coordinator drives it: server/coordinator/
// coordinator_checkpoint.cc, with checkpoint_driver.h for the file work):
//   1. the coordinator pauses every worker at one agreed step (heartbeat
//      `pause`, the job's KV store, the workers' `paused` events; the
//      worker's side is worker/pause_protocol.h, the keys pause_keys.h);
//   2. each shard (or, all-reduce, worker 0's local store) writes its table
//      with SaveTable into <output_dir>/<job_id>/ckpt-<step>.tmp/ (a job
//      with embedding tables: and its rows with SaveEmbeddings, emb-<i>.bin;
//      a QAT job: worker 0 its model's buffers too, buffers.pt);
//   3. the coordinator writes manifest.json there and CommitCheckpoint
//      renames the directory to ckpt-<step>/ and prunes older ones;
//   4. a restore reads the manifest and sends each shard RestoreRequest()
//      for the chunks the (possibly new) partition plan gives it (and
//      LoadEmbeddings with every embedding file: it keeps its rows); the
//      workers load buffers.pt themselves (worker/checkpoint_buffers.h).
// Names sent to shards are relative to their --checkpoint_root.
#ifndef PSTRAIN_CHECKPOINT_LAYOUT_H_
#define PSTRAIN_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.h"
#include "proto/parameter.pb.h"

namespace pstrain {

// `path` (absolute, or relative to the working directory) made absolute
// and normalized, symbolic links in the part that exists resolved, and
// checked to lie under `root` (absolute, symlink-free: CanonicalRoot).
// INVALID_ARGUMENT naming `what` otherwise: a client cannot make the
// coordinator read or write outside the shared volume.
absl::StatusOr<std::string> PathUnderRoot(const std::string& root, const std::string& path, const char* what);
// `dir` (a result of PathUnderRoot) as a name relative to `root`, which
// is how shards, with their own --checkpoint_root, are told of it.
std::string RelativeToRoot(const std::string& root, const std::string& dir);

// <output_dir>/<job_id>: the job's own directory (checkpoints, weights).
std::string JobDir(const std::string& output_dir, const std::string& job_id);
// <job_dir>/ckpt-<step>.
std::string CheckpointDir(const std::string& job_dir, int64_t step);
// The temporary directory a checkpoint is written to before the commit.
std::string PendingCheckpointDir(const std::string& checkpoint_dir);

// Renames `pending` (whose manifest is written) to `dir`, fsyncs the
// parent, then removes all but the newest `keep` ckpt-<step> directories
// beside it (only its own job's: the parent is the job's directory), and
// those a kept one's embeddings are incremental on (its chain's bases).
// Retention failures are ignored. An older directory of that name is
// replaced atomically (RENAME_EXCHANGE; where the file system has none,
// moved aside first and put back by RecoverCheckpoints after a crash): a
// crash at any point leaves `dir` whole, old or new. Starts with
// RecoverCheckpoints on the parent.
absl::Status CommitCheckpoint(const std::string& pending, const std::string& dir, int keep);

// Tidies what a commit that crashed left in a job's directory: an old
// ckpt-<step> moved aside and not replaced comes back, the rest of the
// leftovers (ckpt-<step>.new, .old) go. Directories in progress
// (ckpt-<step>.tmp) are left alone. Errors are ignored.
void RecoverCheckpoints(const std::string& job_dir);

// Fault injection for CommitCheckpoint's tests (a process-wide setting):
// `after_step` runs after each step that changes the job's directory
// ("staged", "exchanged", "moved aside", "renamed", "removed old");
// `no_exchange` makes it take the path of a file system without
// RENAME_EXCHANGE.
struct CommitCheckpointTesting {
  std::function<void(const char* step)> after_step;
  bool no_exchange = false;
};
void SetCommitCheckpointTestingForTesting(CommitCheckpointTesting testing);

// The LoadTable request restoring `keys` of `job` (attempt `attempt`) from
// the checkpoint whose manifest is `manifest`; `dir_name` is the checkpoint
// directory as the receiving store names it (relative to its root).
LoadTableRequest RestoreRequest(const CheckpointManifest& manifest, const std::string& dir_name,
                                const std::string& job, uint64_t attempt, const TableConfig& config,
                                const std::vector<std::string>& keys);

}  // namespace pstrain

#endif  // PSTRAIN_CHECKPOINT_LAYOUT_H_
