// The keys of a checkpoint's pause in the job's KV store (the coordinator's
// rendezvous, reached by the workers with ClusterMember::KvGet/KvSet/KvAdd),
// spelled once for both sides. `pause_id` is the coordinator's, sent to the
// workers with the heartbeat's `pause`; it is unique across coordinator
// lifetimes, so one pause's keys never meet another's.
//
// Who writes and who reads (worker/pause_protocol.h has the exchange):
//   pause/<id>/votes  every worker adds 1 when it first sees the pause; the
//                     first (the one that reads 1) picks the step
//   pause/<id>/step   the step every worker stops before (decimal)
//   ckpt/<id>/path    all-reduce: the coordinator names the file worker 0
//                     writes its table to
//   ckpt/<id>/saved   all-reduce: worker 0's answer, a WorkerSaveReport
//                     (proto/checkpoint.proto) in binary form
//   ckpt/<id>/stage-<s>/path, ckpt/<id>/stage-<s>/saved   a pipelined
//                     job's: the same for stage s of its first replica
//                     (worker s writes its stage's table; stage 0 is worker
//                     0 under the keys above)
//   ckpt/<id>/buffers_path, ckpt/<id>/buffers_saved   the same for the
//                     model's buffers (QAT's quantizers), either mode
#ifndef PSTRAIN_CHECKPOINT_PAUSE_KEYS_H_
#define PSTRAIN_CHECKPOINT_PAUSE_KEYS_H_

#include <cstdint>
#include <string>

namespace pstrain {

std::string PauseVotesKey(int64_t pause_id);
std::string PauseStepKey(int64_t pause_id);
std::string CheckpointPathKey(int64_t pause_id, int stage = 0);
std::string CheckpointSavedKey(int64_t pause_id, int stage = 0);
std::string CheckpointBuffersPathKey(int64_t pause_id);
std::string CheckpointBuffersSavedKey(int64_t pause_id);

// The coordinator's keys (ckpt/<id>/path, ckpt/<id>/buffers_path: where
// worker 0 writes): a member's KvSet or KvAdd of one is refused, or a
// member could have worker 0 write anywhere it may.
bool IsCheckpointPathKey(const std::string& key);
// The workers' answers (ckpt/<id>/saved, ckpt/<id>/buffers_saved,
// ckpt/<id>/stage-<s>/saved).
bool IsCheckpointSavedKey(const std::string& key);
// The only worker that may write a saved key: its stage s (worker s of a
// pipelined job), 0 for the others; -1 for a key that names no valid stage.
int CheckpointSavedKeyWriter(const std::string& key);

}  // namespace pstrain

#endif  // PSTRAIN_CHECKPOINT_PAUSE_KEYS_H_
