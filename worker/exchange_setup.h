// The gradient exchange a training loop runs over (worker/gradient_exchange.h),
// built from the loop's options: the partition plan of its parameters, a
// PsClient over the job's shards (parameter-server mode) or over the local
// store (all-reduce mode), the exchange itself, and the tables initialised.
// Shared by the dense loop (worker/trainer.cc) and the CTR loop
// (worker/ctr_trainer.cc), so both speak to the shards the same way.
#ifndef PSTRAIN_WORKER_EXCHANGE_SETUP_H_
#define PSTRAIN_WORKER_EXCHANGE_SETUP_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/partition_plan.h"
#include "worker/gradient_exchange.h"
#include "worker/ps_client.h"
#include "worker/trainer_options.h"

namespace pstrain {

class Activity;
class LossScaler;

// The exchange and the client it pushes through. Members are destroyed in
// reverse order: the exchange (which uses the client) before the client.
struct ExchangeSet {
  std::unique_ptr<PsClient> ps;
  std::unique_ptr<GradientExchange> exchange;
};

// Builds the exchange for `params` (laid out as `specs`, on options.device)
// and initialises its tables: in parameter-server mode every rank offers
// the same seeded values, the first InitTable wins and everyone starts from
// the shards' values; in all-reduce mode (options.collective set) rank 0's
// values are broadcast and options.restore_local, when set, loads a
// checkpoint into the local store. `activity` (not owned) is told of every
// shard call; `scaler` (may be null) is the all-reduce exchange's loss
// scaler. A pipeline stage in parameter-server mode gives `whole`, the
// whole model's layout: its chunks lie where the whole model's plan puts
// them, in tables of every stage's keys (PsClientOptions::whole_plan).
// INVALID_ARGUMENT for all-reduce without a local store or with shards;
// the plan's, the client's or the shards' error otherwise.
absl::StatusOr<ExchangeSet> MakeExchange(const TrainerOptions& options, const std::vector<at::Tensor>& params,
                                         const std::vector<ParameterSpec>& specs, Activity* activity,
                                         LossScaler* scaler, const std::vector<ParameterSpec>* whole = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_EXCHANGE_SETUP_H_
