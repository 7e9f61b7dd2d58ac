// The manifest of a checkpoint directory ckpt-<step>/: which job and step,
// the job's spec, the model's parameters and chunk size (so a restore can
// re-partition onto any number of shards), where each worker was in its
// epochs, each shard file with its size and crc32, and (a job with
// embedding tables, model dlrm) each shard's embedding file, the same way
// (absent from older manifests: read as none). JSON, written last
// and atomically: a directory without a readable manifest whose files all
// match is not a checkpoint.
#ifndef PSTRAIN_CHECKPOINT_MANIFEST_H_
#define PSTRAIN_CHECKPOINT_MANIFEST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/partition_plan.h"

namespace pstrain {

struct CheckpointManifest {
  std::string job;
  std::string name;
  // Random, nonzero (0: a checkpoint of an older pstrain): what an
  // incremental checkpoint's files and manifest name their base by.
  uint64_t id = 0;
  int64_t step = 0;  // the slowest worker's next step
  int64_t created_unix_ms = 0;
  std::string spec_yaml;
  int64_t chunk_bytes = 0;
  std::vector<ParameterSpec> params;
  struct Worker {
    int rank = 0;
    int64_t step = 0;
    int epoch = 0;
    int64_t epoch_step = 0;
    // precision fp16: the rank's loss scale at the pause (0: none), a power
    // of two in [2^-24, 2^127] (ValidLossScale).
    double loss_scale = 0;
  };
  std::vector<Worker> workers;
  struct ShardFile {
    int index = 0;
    std::string file;  // relative to the checkpoint directory
    uint64_t bytes = 0;
    uint32_t crc32 = 0;
  };
  std::vector<ShardFile> shards;
  // The shards' SaveEmbeddings files (embedding/embedding_files.h), one per
  // shard of the checkpointed job; empty for a job without embeddings. A
  // restore hands every one of them to every new shard, which keeps its rows.
  std::vector<ShardFile> embeddings;
  // Incremental embedding files (docs/embeddings.md): the checkpoint they
  // are incremental on, a sibling directory's name (ckpt-<step>) and its
  // id, and how many incremental checkpoints lead back to a whole one
  // (this one included). Empty, 0, 0: whole.
  std::string embeddings_base;
  uint64_t embeddings_base_id = 0;
  int embeddings_chain = 0;
  // Worker 0's model buffers (QAT's quantizers, common/weights_file.h's
  // format): none, or one file every resumed worker loads.
  std::vector<ShardFile> buffers;
};

constexpr char kManifestName[] = "manifest.json";

// A fresh CheckpointManifest::id: random, nonzero.
uint64_t NewCheckpointId();

// A loss scale a checkpoint may carry: finite, in [2^-24, 2^127] (what a
// LossScaler can reach before it fails the job or stops growing).
bool ValidLossScale(double scale);

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest);
// Reads and checks a manifest: every shard and embedding file must exist with its size
// (the crc32 is checked by the shards when they load the files).
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir);

// A manifest read names at most this many incremental checkpoints back to
// a whole one (a job's spec allows at most 32: job_spec.h).
constexpr int kMaxEmbeddingChain = 64;

// The checkpoints whose embedding files restore the one in `dir` (whose
// manifest is `manifest`): its bases, oldest (a whole one) first, then
// `dir` itself, each as its directory and the paths of its embedding files
// (ReadEmbeddingChain's order). DATA_LOSS naming what is wrong where a base
// is gone, was replaced (another id), or the chain is longer than
// kMaxEmbeddingChain.
struct EmbeddingChainLink {
  std::string dir;
  std::vector<std::string> files;  // dir/<file>, in the manifest's order
};
absl::StatusOr<std::vector<EmbeddingChainLink>> EmbeddingChain(const std::string& dir,
                                                               const CheckpointManifest& manifest);

// Where each of `workers` workers starts after restoring `manifest`: where
// it paused, when the worker count is the same; else the checkpoint's
// epoch, at its start, on its new slice. The coordinator's assignments and
// a standalone worker's --resume_from both start from here.
std::vector<CheckpointManifest::Worker> StartPositions(const CheckpointManifest& manifest, int workers);

}  // namespace pstrain

#endif  // PSTRAIN_CHECKPOINT_MANIFEST_H_
