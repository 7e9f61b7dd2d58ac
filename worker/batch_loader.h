// BatchLoader: one rank's next micro-batches, gathered on a background
// thread (into pinned memory when the model trains on an accelerator) while
// the current step computes, at most `depth` ahead. The trainer copies each
// to its device without blocking and normalises it there, so the device
// never waits for the host to gather data.
#ifndef PSTRAIN_WORKER_BATCH_LOADER_H_
#define PSTRAIN_WORKER_BATCH_LOADER_H_

#include <ATen/core/Tensor.h>

#include <deque>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/dataset.h"
#include "worker/sampler.h"

namespace pstrain {

struct BatchPlan {
  int64_t batch_size = 64;
  int start_epoch = 0;
  int64_t start_micro = 0;  // in start_epoch
  int epochs = 1;
  int64_t micro_per_epoch = 1;
  bool pin = false;  // pinned host memory (the model is on an accelerator)
  int depth = 2;     // batches ready ahead of the trainer
};

class BatchLoader {
 public:
  struct Batch {
    int epoch = 0;
    int64_t micro = 0;
    at::Tensor inputs;  // rows of Dataset::inputs (not normalised)
    at::Tensor labels;
  };
  // `data` and `sampler` must outlive the loader. Batches come in order:
  // every micro-batch of every epoch from (start_epoch, start_micro) on.
  BatchLoader(const Dataset& data, const DistributedSampler& sampler, BatchPlan plan);
  ~BatchLoader();  // stops the thread; batches not taken are dropped
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch, which must be (epoch, micro): the trainer and the loader
  // walk the same sequence.
  absl::StatusOr<Batch> Next(int epoch, int64_t micro);

 private:
  void Loop();

  const Dataset& data_;
  const DistributedSampler& sampler_;
  const BatchPlan plan_;
  absl::Mutex mu_;
  std::deque<Batch> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Batches of other ranks' slices, gathered on demand on the caller's thread:
// for a SYNC step that covers a vacant rank's batch (see AssignBatches).
// Keeps one epoch's order per rank it was asked for.
class CoverLoader {
 public:
  // The job's sampler settings: the slices are DistributedSampler's.
  CoverLoader(const Dataset& data, int world_size, uint64_t seed, int64_t batch_size)
      : data_(data), world_(world_size), seed_(seed), batch_size_(batch_size) {}
  // Micro-batch `micro` of rank `rank`'s slice in `epoch`.
  absl::StatusOr<BatchLoader::Batch> Get(int rank, int epoch, int64_t micro);

 private:
  struct Slice {
    std::unique_ptr<DistributedSampler> sampler;
    int epoch = -1;
    std::vector<int64_t> order;
  };
  const Dataset& data_;
  const int world_;
  const uint64_t seed_;
  const int64_t batch_size_;
  std::map<int, Slice> slices_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_BATCH_LOADER_H_
