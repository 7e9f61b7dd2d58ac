// The WorkerEvents (proto/events.proto) a trainer emits besides progress
// (worker/progress_window.h): the model's layout, evaluations, the weights
// written and the end of the run. Each names the rank it comes from.
#ifndef PSTRAIN_WORKER_TRAINER_EVENTS_H_
#define PSTRAIN_WORKER_TRAINER_EVENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/partition_plan.h"
#include "proto/events.pb.h"
#include "worker/evaluation.h"

namespace pstrain {

// Rank 0's: the parameters as the tables hold them (for checkpoints and
// their re-partitioning).
WorkerEvent PlanEvent(int rank, int64_t chunk_bytes, const std::vector<ParameterSpec>& params);
// After `epoch` epochs; `final`: the run's last.
WorkerEvent EvalEvent(int rank, int epoch, const EvalResult& ev, bool final);
WorkerEvent WeightsEvent(int rank, const std::string& path);
WorkerEvent DoneEvent(int rank, int64_t steps, int64_t samples, double seconds, int64_t skipped_steps);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAINER_EVENTS_H_
