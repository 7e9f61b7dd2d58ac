#include "worker/ps_client.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "rpc/tensor_codec.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(PsClientOptions options,
                                                           std::vector<ParameterStore*> shards) {
  if (static_cast<int>(shards.size()) != options.plan.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("the plan has ", options.plan.num_shards,
                                                   " shards but ", shards.size(), " were given"));
  }
  if (options.job.empty()) return absl::InvalidArgumentError("job must not be empty");
  return std::unique_ptr<PsClient>(new PsClient(std::move(options), std::move(shards)));
}

absl::Status PsClient::CheckTensors(const std::vector<at::Tensor>& tensors, const char* what) const {
  const auto& params = options_.plan.params;
  if (tensors.size() != params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tensors.size(), " ", what, " for ", params.size(), " planned parameters"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || !t.is_contiguous() || !t.device().is_cpu() ||
        std::vector<int64_t>(t.sizes().begin(), t.sizes().end()) != params[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", i, " (", params[i].name, ") must be a contiguous CPU tensor of the planned shape"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorBuffer>> PsClient::ChunkViews(
    const std::vector<at::Tensor>& tensors, int shard) const {
  std::vector<TensorBuffer> out;
  for (size_t idx : options_.plan.shard_chunks[shard]) {
    const ChunkSpec& c = options_.plan.chunks[idx];
    const at::Tensor& t = tensors[c.param];
    absl::StatusOr<TensorBuffer> whole = TensorToBuffer(t);
    if (!whole.ok()) return whole.status();
    const size_t elem = DataTypeSize(whole->dtype);
    TensorBuffer view = *whole;
    view.shape = {c.numel};
    view.data = whole->data + c.offset * elem;
    view.nbytes = c.numel * elem;
    out.push_back(std::move(view));
  }
  return out;
}

absl::Status PsClient::CopyIntoParams(int shard, const std::vector<TensorBuffer>& values,
                                      const std::vector<at::Tensor>& params) const {
  const auto& ids = options_.plan.shard_chunks[shard];
  if (values.size() != ids.size()) {
    return absl::InternalError(absl::StrCat("shard ", shard, " returned ", values.size(),
                                            " values for ", ids.size(), " keys"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const ChunkSpec& c = options_.plan.chunks[ids[i]];
    const at::Tensor& p = params[c.param];
    if (values[i].nbytes != c.bytes) {
      return absl::InternalError(absl::StrCat("shard ", shard, " returned ", values[i].nbytes,
                                              " bytes for ", c.key, ", expected ", c.bytes));
    }
    uint8_t* dst = static_cast<uint8_t*>(p.data_ptr()) + c.offset * p.element_size();
    // Usually the store wrote straight into the parameter (see ChunkViews
    // passed as destinations); copy only if it did not.
    if (values[i].data != dst) std::memcpy(dst, values[i].data, c.bytes);
  }
  return absl::OkStatus();
}

absl::Status PsClient::ForEachShard(const std::function<void(int, StatusCallback)>& call) {
  std::mutex mu;
  std::condition_variable cv;
  int pending = static_cast<int>(shards_.size());
  absl::Status first_error;
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) {
    call(s, [&, s](absl::Status status) {
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok() && first_error.ok()) {
        first_error = absl::Status(status.code(), absl::StrCat("shard ", s, ": ", status.message()));
      }
      if (--pending == 0) cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return pending == 0; });
  return first_error;
}

absl::Status PsClient::InitTables(const std::vector<at::Tensor>& params, const TableConfig& config) {
  absl::Status s = CheckTensors(params, "parameters");
  if (!s.ok()) return s;
  CallOptions opts;
  opts.deadline = absl::Now() + options_.timeout;
  std::vector<InitTableRequest> requests(shards_.size());
  std::vector<InitTableResponse> responses(shards_.size());
  return ForEachShard([&](int shard, StatusCallback done) {
    auto views = ChunkViews(params, shard);
    if (!views.ok()) return done(views.status());
    InitTableRequest& req = requests[shard];
    req.set_job(options_.job);
    *req.mutable_config() = config;
    for (size_t idx : options_.plan.shard_chunks[shard]) req.add_keys(options_.plan.chunks[idx].key);
    shards_[shard]->InitTable(req, std::move(*views), &responses[shard], opts, std::move(done));
  });
}

absl::Status PsClient::Pull(const std::vector<at::Tensor>& params, int64_t min_version) {
  absl::Status s = CheckTensors(params, "parameters");
  if (!s.ok()) return s;
  CallOptions opts;
  opts.deadline = absl::Now() + options_.timeout;
  std::vector<PullRequest> requests(shards_.size());
  std::vector<PullResponse> responses(shards_.size());
  std::vector<std::vector<TensorBuffer>> values(shards_.size());
  return ForEachShard([&](int shard, StatusCallback done) {
    auto dest = ChunkViews(params, shard);
    if (!dest.ok()) return done(dest.status());
    values[shard] = std::move(*dest);
    PullRequest& req = requests[shard];
    req.set_job(options_.job);
    req.set_min_version(min_version);
    for (size_t idx : options_.plan.shard_chunks[shard]) req.add_keys(options_.plan.chunks[idx].key);
    shards_[shard]->Pull(req, &responses[shard], &values[shard], opts,
                         [&, shard, done = std::move(done)](absl::Status st) {
                           if (st.ok()) st = CopyIntoParams(shard, values[shard], params);
                           values[shard].clear();
                           done(st);
                         });
  });
}

absl::Status PsClient::Push(int64_t step, const std::vector<at::Tensor>& grads) {
  absl::Status s = CheckTensors(grads, "gradients");
  if (!s.ok()) return s;
  CallOptions opts;
  opts.deadline = absl::Now() + options_.timeout;
  std::vector<PushRequest> requests(shards_.size());
  std::vector<PushResponse> responses(shards_.size());
  return ForEachShard([&](int shard, StatusCallback done) {
    auto views = ChunkViews(grads, shard);
    if (!views.ok()) return done(views.status());
    PushRequest& req = requests[shard];
    req.set_job(options_.job);
    req.set_worker(options_.worker);
    req.set_step(step);
    for (size_t idx : options_.plan.shard_chunks[shard]) req.add_keys(options_.plan.chunks[idx].key);
    shards_[shard]->Push(req, std::move(*views), &responses[shard], opts, std::move(done));
  });
}

absl::Status PsClient::PushPull(int64_t step, const std::vector<at::Tensor>& grads,
                                const std::vector<at::Tensor>& params) {
  absl::Status s = CheckTensors(grads, "gradients");
  if (s.ok()) s = CheckTensors(params, "parameters");
  if (!s.ok()) return s;
  CallOptions opts;
  opts.deadline = absl::Now() + options_.timeout;
  std::vector<PushPullRequest> requests(shards_.size());
  std::vector<PushPullResponse> responses(shards_.size());
  std::vector<std::vector<TensorBuffer>> values(shards_.size());
  return ForEachShard([&](int shard, StatusCallback done) {
    auto views = ChunkViews(grads, shard);
    if (!views.ok()) return done(views.status());
    auto dest = ChunkViews(params, shard);
    if (!dest.ok()) return done(dest.status());
    values[shard] = std::move(*dest);
    PushPullRequest& req = requests[shard];
    req.set_job(options_.job);
    req.set_worker(options_.worker);
    req.set_step(step);
    for (size_t idx : options_.plan.shard_chunks[shard]) req.add_keys(options_.plan.chunks[idx].key);
    shards_[shard]->PushPull(req, std::move(*views), &responses[shard], &values[shard], opts,
                             [&, shard, done = std::move(done)](absl::Status st) {
                               if (st.ok()) st = CopyIntoParams(shard, values[shard], params);
                               values[shard].clear();
                               done(st);
                             });
  });
}

}  // namespace pstrain
