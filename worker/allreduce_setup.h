// What all-reduce mode needs around the trainer: the rendezvous (the
// coordinator's per-job KV store for a pool member, or torchrun's TCPStore
// at MASTER_ADDR:MASTER_PORT when launched standalone), the collective, the
// local store that applies the optimizer, loading a checkpoint into it, and
// saving it for one.
#ifndef PSTRAIN_WORKER_ALLREDUCE_SETUP_H_
#define PSTRAIN_WORKER_ALLREDUCE_SETUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collective/collective.h"
#include "common/job_spec.h"
#include "rpc/cluster_member.h"
#include "table/shard_store.h"
#include "worker/trainer_options.h"

namespace pstrain {

struct AllReduceOptions {
  JobSpec spec;
  int rank = 0;
  int world_size = 1;
  ClusterMember* member = nullptr;  // pool member: rendezvous through the coordinator
  // Standalone: torchrun's rendezvous (rank 0 serves it).
  std::string master_addr;
  int master_port = 0;
  // Where the trainer keeps the model: backend auto picks NCCL for a CUDA
  // device (when this build has it), Gloo otherwise.
  c10::Device device = c10::Device(c10::kCPU);
  std::string resume_from;  // checkpoint directory, or empty
  // gloo: this rank's address for its peers, or the interface to use
  // (GLOO_SOCKET_IFNAME); both empty: this host's name.
  std::string gloo_hostname;
  std::string gloo_interface;
};

class AllReduceSetup {
 public:
  static absl::StatusOr<std::unique_ptr<AllReduceSetup>> Create(const AllReduceOptions& options);

  // The whole job's group.
  Collective* collective() { return collective_.get(); }
  // The group that averages this rank's gradients: the whole job's, or in
  // a pipelined all-reduce job its stage's replicas (TrainerOptions::collective).
  Collective* exchange_group() { return stage_group_ != nullptr ? stage_group_.get() : collective_.get(); }
  // A pipelined job's whole group, whose point-to-point carries the
  // stages' activations (TrainerOptions::pipeline); null otherwise.
  Collective* pipeline_group() { return options_.spec.pipeline.enabled() ? collective_.get() : nullptr; }
  ShardStore* local_store() { return local_.get(); }
  // For TrainerOptions::restore_local; empty when not resuming.
  std::function<absl::Status(const std::vector<std::string>& keys)> restore_local();
  // Writes the local store's table to `path` (a checkpoint's shard file)
  // and returns what SaveTable says of it (its size and crc32 go to the
  // coordinator: worker/pause_protocol.h). `flush` first makes the local
  // store current (StepBoundary::flush).
  absl::StatusOr<SaveTableResponse> SaveTable(const std::string& path, const std::function<absl::Status()>& flush);
  // Gives `options` what the trainer takes from here: in all-reduce mode
  // the groups, the local store and the restore; for a ps job (its QAT
  // workers' group), the group as TrainerOptions::observer_group alone.
  void Wire(TrainerOptions* options);

 private:
  AllReduceOptions options_;
  std::shared_ptr<KeyValueStore> store_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<Collective> stage_group_;
  std::unique_ptr<ShardStore> local_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_ALLREDUCE_SETUP_H_
