#include "worker/exchange_setup.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/job_spec.h"
#include "table/shard_store.h"
#include "worker/loss_scaler.h"

namespace pstrain {

absl::StatusOr<ExchangeSet> MakeExchange(const TrainerOptions& options, const std::vector<at::Tensor>& params,
                                         const std::vector<ParameterSpec>& specs, Activity* activity,
                                         LossScaler* scaler, const std::vector<ParameterSpec>* whole) {
  const JobSpec& spec = options.spec;
  const bool allreduce = options.collective != nullptr;
  if (allreduce && (options.local_store == nullptr || !options.shards.empty())) {
    return absl::InvalidArgumentError("all-reduce mode needs a local store and no shards");
  }
  PsClientOptions po;
  if (!allreduce && whole != nullptr && spec.pipeline.stages > 1) {
    auto whole_plan = MakePartitionPlan(*whole, spec.shards, static_cast<size_t>(spec.chunk_bytes), spec.replicas);
    if (!whole_plan.ok()) return whole_plan.status();
    po.whole_plan = std::move(*whole_plan);
    po.stage = static_cast<uint32_t>(options.rank % spec.pipeline.stages);
  }
  auto plan = po.whole_plan.num_shards > 0
                  ? RestrictPlan(po.whole_plan, specs)
                  : MakePartitionPlan(specs, allreduce ? 1 : spec.shards, static_cast<size_t>(spec.chunk_bytes),
                                      allreduce ? 0 : spec.replicas);
  if (!plan.ok()) return plan.status();
  po.job = spec.name;
  po.attempt = allreduce ? 0 : options.attempt;  // the local store is this attempt's alone
  po.worker = allreduce ? 0 : static_cast<uint32_t>(options.rank);
  po.generation = allreduce ? 0 : options.generation;
  po.job_secret = options.job_secret;
  po.table_grant = options.table_grant;
  po.activity = activity;
  po.wire_dtype = spec.wire_dtype == WireDtype::kBf16   ? DT_BFLOAT16
                  : spec.wire_dtype == WireDtype::kFp16 ? DT_FLOAT16
                                                        : DT_FLOAT32;
  po.error_feedback = spec.wire_error_feedback;
  po.max_in_flight_per_shard = allreduce ? 0 : spec.requests_in_flight;
  po.plan = *plan;
  po.shard_targets = options.shard_targets;
  po.next_routing = options.next_routing;
  po.connect = options.connect_shard;
  po.stop = options.stop;
  auto ps = PsClient::Create(po, allreduce ? std::vector<ParameterStore*>{options.local_store} : options.shards);
  if (!ps.ok()) return ps.status();
  ExchangeSet set;
  set.ps = std::move(*ps);
  ExchangeOptions eo;
  eo.ps = set.ps.get();
  for (const auto& p : params) eo.params.push_back(p.detach());
  eo.device = options.device;
  eo.bucket_bytes = spec.bucket_bytes;
  eo.collective = options.collective;
  eo.clip_grad_norm = spec.clip_grad_norm;
  if (allreduce && spec.pipeline.enabled() && options.pipeline != nullptr) {
    eo.norm_group = options.pipeline;
    eo.norm_copies = std::max(1, options.world_size / spec.pipeline.stages);
  }
  eo.wire_dtype = spec.wire_dtype == WireDtype::kBf16   ? at::kBFloat16
                  : spec.wire_dtype == WireDtype::kFp16 ? at::kHalf
                                                        : at::kFloat;
  // On an accelerator, gradients are narrowed for the wire (and values
  // widened) there: half the bytes over PCIe and no conversion on the host.
  eo.narrow_on_device = !options.device.is_cpu();
  eo.error_feedback = spec.wire_error_feedback;
  eo.job = spec.name;
  eo.loss_scaler = allreduce ? scaler : nullptr;
  if (allreduce) {
    // Everyone starts from rank 0's values (as DDP does); the local store,
    // one worker's SYNC table, is the checkpoint format.
    eo.local_store = options.local_store;
    auto e = MakeAllReduceExchange(eo);
    if (!e.ok()) return e.status();
    set.exchange = std::move(*e);
    if (options.restore_local) {
      std::vector<std::string> keys;
      for (const auto& c : plan->chunks) keys.push_back(c.key);
      absl::Status s = options.restore_local(keys);
      if (!s.ok()) return s;
    }
  } else {
    set.exchange = MakePsExchange(eo);
  }
  // PS: every rank offers the same seeded values; the first InitTable wins
  // and the rest find an identical table. Then everyone starts from the
  // shards' (a restored table's, when resuming).
  absl::Status s = set.exchange->InitTables(MakeTableConfig(spec));
  if (!s.ok()) return s;
  return set;
}

}  // namespace pstrain
