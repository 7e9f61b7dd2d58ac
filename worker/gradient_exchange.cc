#include "worker/gradient_exchange.h"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "worker/ps_client.h"

namespace pstrain {

GradientExchange::GradientExchange(ExchangeOptions options)
    : options_(std::move(options)),
      stager_(std::make_unique<DeviceStager>(options_.device)) {
  const auto& params = options_.params;
  bucket_of_.resize(params.size());
  std::vector<size_t> current;
  int64_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    current.push_back(i);
    bytes += params[i].nbytes();
    // A bucket holds one dtype (all-reduce packs it into one buffer).
    if (bytes >= options_.bucket_bytes || i == 0 || params[i - 1].scalar_type() != params[i].scalar_type()) {
      for (size_t p : current) bucket_of_[p] = buckets_.size();
      buckets_.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
  }
  missing_.resize(buckets_.size());
  ready_.resize(params.size());
  for (const auto& p : params) staging_.push_back(HostBufferFor(p, options_.device));
}

GradientExchange::~GradientExchange() = default;

absl::Status GradientExchange::InitTables(const TableConfig& config) {
  std::vector<at::Tensor> host;
  for (size_t i = 0; i < staging_.size(); ++i) host.push_back(staging_[i].copy_(options_.params[i]));
  absl::Status s = options_.ps->InitTables(host, config);
  if (!s.ok()) return s;
  return Pull();
}

absl::Status GradientExchange::Pull(int64_t min_version, int64_t min_worker_steps) {
  absl::Status s = options_.ps->Pull(staging_, min_version, min_worker_steps);
  if (s.ok()) UploadStaging();
  return s;
}

void GradientExchange::UploadStaging(const std::vector<bool>* skip) {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < staging_.size(); ++i) {
    if (skip == nullptr || !(*skip)[i]) DeviceStager::Upload(staging_[i], options_.params[i]);
  }
}

void GradientExchange::BeginStep(int64_t step, double lr) {
  step_ = step;
  lr_ = lr;
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].size();
  std::fill(ready_.begin(), ready_.end(), at::Tensor());
}

void GradientExchange::Abandon() { stager_->Drain(); }

}  // namespace pstrain
