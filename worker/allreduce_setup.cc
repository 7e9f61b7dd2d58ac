#include "worker/allreduce_setup.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"

namespace pstrain {
namespace {

// The coordinator's KV store of the member's current job.
class MemberKvStore : public KeyValueStore {
 public:
  explicit MemberKvStore(ClusterMember* member) : member_(member) {}
  absl::Status Set(const std::string& key, const std::string& value) override { return member_->KvSet(key, value); }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return member_->KvGet(key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override { return member_->KvAdd(key, delta); }

 private:
  ClusterMember* member_;
};

// The collective library for a job's `backend` on `device`: NCCL reduces
// CUDA tensors only, so asking for it on the CPU is refused before anything
// starts rather than failing at the first reduction; auto takes NCCL for a
// CUDA device where this build has it, else Gloo (which reduces host copies
// of CUDA gradients).
absl::StatusOr<Collective::Backend> ResolveBackend(CollectiveBackend backend, const c10::Device& device) {
  if (backend == CollectiveBackend::kNccl && !device.is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend nccl reduces CUDA tensors, but this worker trains on ", device.str(),
        " (device: cpu, or no CUDA device here); use backend gloo or auto"));
  }
  switch (backend) {
    case CollectiveBackend::kGloo: return Collective::Backend::kGloo;
    case CollectiveBackend::kNccl: return Collective::Backend::kNccl;
    case CollectiveBackend::kAuto: break;
  }
  return device.is_cuda() && NcclBuilt() ? Collective::Backend::kNccl : Collective::Backend::kGloo;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AllReduceSetup>> AllReduceSetup::Create(const AllReduceOptions& options) {
  std::unique_ptr<AllReduceSetup> s(new AllReduceSetup());
  s->options_ = options;
  const absl::Duration timeout = absl::Seconds(options.spec.collective_timeout_s);
  if (options.member != nullptr) {
    s->store_ = std::make_shared<MemberKvStore>(options.member);
  } else {
    if (options.master_addr.empty() || options.master_port <= 0) {
      return absl::InvalidArgumentError(
          "all-reduce mode without a coordinator needs MASTER_ADDR and MASTER_PORT (torchrun's variables)");
    }
    auto store = ConnectTcpStore(options.master_addr, options.master_port, options.rank == 0, options.world_size,
                                 timeout);
    if (!store.ok()) return store.status();
    s->store_ = *store;
  }
  CollectiveOptions co;
  co.rank = options.rank;
  co.size = options.world_size;
  co.store = s->store_;
  co.prefix = "collective/";
  co.timeout = timeout;
  co.hostname = options.gloo_hostname;
  co.interface = options.gloo_interface;
  co.device = options.device.is_cuda() ? options.device.index() : 0;
  auto backend = ResolveBackend(options.spec.backend, options.device);
  if (!backend.ok()) return backend.status();
  auto collective = CreateCollective(*backend, co);
  if (!collective.ok()) return collective.status();
  s->collective_ = std::move(*collective);
  if (options.spec.pipeline.enabled() && options.spec.allreduce()) {
    // Rank = replica * P + stage: stage s's replicas average their
    // gradients in a group of their own (a ps job's, on the shards).
    const int stages = options.spec.pipeline.stages;
    co.rank = options.rank / stages;
    co.size = options.world_size / stages;
    co.prefix = absl::StrCat("collective/stage-", options.rank % stages, "/");
    auto group = CreateCollective(*backend, co);
    if (!group.ok()) return group.status();
    s->stage_group_ = std::move(*group);
  }
  // The local store reads and writes the checkpoint paths the coordinator
  // (or the resume flag) names: absolute, given relative to "/".
  ShardStoreOptions local;
  local.checkpoint_root = "/";
  s->local_ = std::make_unique<ShardStore>(local);
  return s;
}

namespace {

// The local store's names are relative to "/": an absolute path without its
// leading slashes (a relative one is made absolute first).
std::string RelativeToFilesystemRoot(const std::string& path) {
  std::error_code ec;
  std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  size_t i = 0;
  while (i < abs.size() && abs[i] == '/') ++i;
  return abs.substr(i);
}

}  // namespace

std::function<absl::Status(const std::vector<std::string>& keys)> AllReduceSetup::restore_local() {
  if (options_.resume_from.empty()) return nullptr;
  return [this](const std::vector<std::string>& keys) -> absl::Status {
    const std::string& dir = options_.resume_from;
    auto manifest = ReadManifest(dir);
    if (!manifest.ok()) return manifest.status();
    // The local store's names are relative to "/".
    const LoadTableRequest req = RestoreRequest(*manifest, RelativeToFilesystemRoot(dir), options_.spec.name,
                                                /*attempt=*/0, MakeTableConfig(options_.spec), keys);
    LoadTableResponse resp;
    absl::Status s = WaitFor([&](StatusCallback done) { local_->LoadTableAsync(req, &resp, {}, done); });
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("restoring from ", dir, ": ", s.message()));
    return absl::OkStatus();
  };
}

void AllReduceSetup::Wire(TrainerOptions* options) {
  if (!options_.spec.allreduce()) {
    options->observer_group = exchange_group();
    options->pipeline = pipeline_group();
    return;
  }
  options->local_store = local_store();
  options->collective = exchange_group();
  options->pipeline = pipeline_group();
  options->restore_local = restore_local();
}

absl::StatusOr<SaveTableResponse> AllReduceSetup::SaveTable(const std::string& path,
                                                            const std::function<absl::Status()>& flush) {
  SaveTableRequest req;
  req.set_job(options_.spec.name);
  req.set_path(RelativeToFilesystemRoot(path));
  SaveTableResponse resp;
  absl::Status s = flush();
  if (s.ok()) s = WaitFor([&](StatusCallback done) { local_->SaveTableAsync(req, &resp, {}, done); });
  if (!s.ok()) return s;
  return resp;
}

}  // namespace pstrain
