#include "worker/batch_loader.h"

#include <ATen/Functions.h>

#include "absl/strings/str_cat.h"

namespace pstrain {

BatchLoader::BatchLoader(const Dataset& data, const DistributedSampler& sampler, BatchPlan plan)
    : data_(data), sampler_(sampler), plan_(plan) {
  thread_ = std::thread([this] { Loop(); });
}

BatchLoader::~BatchLoader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void BatchLoader::Loop() {
  try {
    for (int epoch = plan_.start_epoch; epoch < plan_.epochs; ++epoch) {
      const std::vector<int64_t> order = sampler_.Indices(epoch);
      for (int64_t m = epoch == plan_.start_epoch ? plan_.start_micro : 0; m < plan_.micro_per_epoch; ++m) {
        {
          absl::MutexLock lock(&mu_);
          const auto room = [this] { return stop_ || static_cast<int>(ready_.size()) < plan_.depth; };
          mu_.Await(absl::Condition(&room));
          if (stop_) return;
        }
        const int64_t b0 = m * plan_.batch_size;
        const int64_t len = std::min<int64_t>(plan_.batch_size, sampler_.per_rank() - b0);
        at::Tensor idx = at::from_blob(const_cast<int64_t*>(order.data() + b0), {len}, at::kLong);
        Batch b;
        b.epoch = epoch;
        b.micro = m;
        b.inputs = data_.inputs.index_select(0, idx);
        b.labels = data_.labels.index_select(0, idx);
        if (plan_.pin) {
          b.inputs = b.inputs.pin_memory();
          b.labels = b.labels.pin_memory();
        }
        absl::MutexLock lock(&mu_);
        ready_.push_back(std::move(b));
      }
    }
  } catch (const c10::Error& e) {
    absl::MutexLock lock(&mu_);
    error_ = absl::InternalError(absl::StrCat("preparing a batch: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<BatchLoader::Batch> CoverLoader::Get(int rank, int epoch, int64_t micro) {
  if (rank < 0 || rank >= world_) return absl::InvalidArgumentError(absl::StrCat("no rank ", rank, " to cover"));
  Slice& s = slices_[rank];
  if (!s.sampler) s.sampler = std::make_unique<DistributedSampler>(data_.size(), rank, world_, seed_);
  if (s.epoch != epoch) {
    s.order = s.sampler->Indices(epoch);
    s.epoch = epoch;
  }
  const int64_t b0 = micro * batch_size_;
  const int64_t len = std::min<int64_t>(batch_size_, s.sampler->per_rank() - b0);
  if (b0 < 0 || len <= 0) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " has no micro-batch ", micro, " in epoch ", epoch));
  }
  try {
    at::Tensor idx = at::from_blob(s.order.data() + b0, {len}, at::kLong);
    BatchLoader::Batch b;
    b.epoch = epoch;
    b.micro = micro;
    b.inputs = data_.inputs.index_select(0, idx);
    b.labels = data_.labels.index_select(0, idx);
    return b;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("gathering rank ", rank, "'s batch: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<BatchLoader::Batch> BatchLoader::Next(int epoch, int64_t micro) {
  Batch b;
  {
    absl::MutexLock lock(&mu_);
    const auto ready = [this] { return !ready_.empty() || !error_.ok(); };
    mu_.Await(absl::Condition(&ready));
    if (ready_.empty()) return error_;
    b = std::move(ready_.front());
    ready_.pop_front();
  }
  if (b.epoch != epoch || b.micro != micro) {
    return absl::InternalError(absl::StrCat("the batch loader is at epoch ", b.epoch, " micro-batch ", b.micro,
                                            " but the trainer at ", epoch, "/", micro));
  }
  return b;
}

}  // namespace pstrain
