#include "worker/ps_client.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/fan_out.h"
#include "rpc/tensor_codec.h"
#include "worker/activity.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(PsClientOptions options,
                                                           std::vector<ParameterStore*> shards) {
  if (static_cast<int>(shards.size()) != options.plan.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan has ", options.plan.num_shards, " shards but ", shards.size(), " were given"));
  }
  if (options.job.empty()) return absl::InvalidArgumentError("job must not be empty");
  if (options.whole_plan.num_shards > 0 && options.whole_plan.num_shards != options.plan.num_shards) {
    return absl::InvalidArgumentError("a stage's plan and the whole model's must have the same shards");
  }
  if (options.plan.replicas > 0 && static_cast<int>(options.shard_targets.size()) != options.plan.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("a replicated plan needs the address of each of its ", options.plan.num_shards, " shards"));
  }
  return std::unique_ptr<PsClient>(new PsClient(std::move(options), std::move(shards)));
}

PsClient::PsClient(PsClientOptions options, std::vector<ParameterStore*> shards)
    : options_(std::move(options)), shards_(std::move(shards)) {
  if (!options_.plan.shard_chunks.empty() && !options_.plan.shard_chunks[0].empty()) {
    view_chunk_ = options_.plan.shard_chunks[0][0];
  }
  route_ = MakeRoute(Routing(), nullptr);
  for (size_t s = 0; s < shards_.size(); ++s) turns_.push_back(std::make_unique<ShardTurns>());
  // Allocated at a chunk's first narrowing (ForWire): gradients that come
  // narrowed already (an exchange narrowing on the device) need none.
  if (options_.error_feedback && IsNarrowFloat(options_.wire_dtype)) residual_.resize(options_.plan.chunks.size());
}

bool PsClient::TravelsAs(const ParameterSpec& spec, const at::Tensor& t) const {
  absl::StatusOr<DataType> dtype = ToDataType(t.scalar_type());
  if (!dtype.ok()) return false;
  return *dtype == spec.dtype ||
         (spec.dtype == DT_FLOAT32 && IsNarrowFloat(options_.wire_dtype) && *dtype == options_.wire_dtype);
}

absl::StatusOr<std::vector<TensorBuffer>> PsClient::ForWire(std::vector<TensorBuffer> views,
                                                            const std::vector<size_t>& ids) {
  if (!IsNarrowFloat(options_.wire_dtype)) return views;
  for (size_t k = 0; k < views.size(); ++k) {
    TensorBuffer& v = views[k];
    if (v.dtype != DT_FLOAT32) continue;  // only float32 parameters travel narrow
    absl::StatusOr<TensorBuffer> narrow = TensorBuffer::TryAllocate(options_.wire_dtype, v.shape);
    if (!narrow.ok()) return narrow.status();
    float* residual = nullptr;
    if (!residual_.empty()) {
      std::vector<float>& r = residual_[ids[k]];
      if (r.empty()) r.assign(options_.plan.chunks[ids[k]].numel, 0.0f);
      residual = r.data();
    }
    NarrowElements(options_.wire_dtype, reinterpret_cast<const float*>(v.data), residual, v.nbytes / 4,
                   narrow->MutableData());
    v = std::move(*narrow);
  }
  return views;
}

CallOptions PsClient::NewCallOptions() const {
  CallOptions opts;
  opts.deadline = absl::Now() + options_.timeout;
  opts.job_secret = options_.job_secret;
  return opts;
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
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, " (", params[i].name, ") must be a contiguous CPU tensor of the planned shape"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Views of the chunks `ids` of the plan, each cut from the flattened tensor
// of its parameter: `tensor_of(param)`. No bytes are copied.
template <typename TensorOf>
absl::StatusOr<std::vector<TensorBuffer>> ChunkViewsOf(const PartitionPlan& plan, const std::vector<size_t>& ids,
                                                       const TensorOf& tensor_of) {
  std::vector<TensorBuffer> out;
  out.reserve(ids.size());
  for (size_t idx : ids) {
    const ChunkSpec& c = plan.chunks[idx];
    absl::StatusOr<TensorBuffer> whole = TensorToBuffer(tensor_of(c.param));
    if (!whole.ok()) return whole.status();
    const size_t elem = DataTypeSize(whole->dtype);
    TensorBuffer view = std::move(*whole);
    view.shape = {c.numel};
    view.data += c.offset * elem;
    view.nbytes = c.numel * elem;
    out.push_back(std::move(view));
  }
  return out;
}

void AddKeys(const PartitionPlan& plan, const std::vector<size_t>& ids,
             google::protobuf::RepeatedPtrField<std::string>* keys) {
  for (size_t idx : ids) keys->Add()->assign(plan.chunks[idx].key);
}

}  // namespace

absl::Status PsClient::ShardError(size_t shard, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("shard ", shard, ": ", status.message()));
}

template <typename Request>
Request& PsClient::Addressed(Request& req, const std::vector<size_t>& chunks) const {
  req.set_job(options_.job);
  req.set_attempt(options_.attempt);
  AddKeys(options_.plan, chunks, req.mutable_keys());
  if constexpr (std::is_same_v<Request, PullRequest> || std::is_same_v<Request, PushPullRequest>) {
    if (IsNarrowFloat(options_.wire_dtype)) req.set_value_dtype(options_.wire_dtype);
  }
  return req;
}

template <typename Request>
Request& PsClient::AddressedPush(Request& req, const std::vector<size_t>& chunks, int64_t step, double lr) const {
  req.set_worker(options_.worker);
  req.set_generation(options_.generation);
  req.set_step(step);
  req.set_lr(lr);
  req.set_extra_batches(extra_batches_);
  req.set_empty(empty_);
  return Addressed(req, chunks);
}

void PsClient::SetStepBatches(uint32_t extra_batches, bool empty) {
  extra_batches_ = extra_batches;
  empty_ = empty;
}

std::vector<uint32_t> PsClient::vacant_ranks() const {
  absl::MutexLock lock(&view_mu_);
  return vacant_ranks_;
}

void PsClient::RecordView(const google::protobuf::RepeatedField<uint32_t>& vacant) {
  absl::MutexLock lock(&view_mu_);
  vacant_ranks_.assign(vacant.begin(), vacant.end());
}

absl::StatusOr<std::vector<TensorBuffer>> PsClient::ChunkViews(const std::vector<at::Tensor>& tensors,
                                                               const std::vector<size_t>& ids) const {
  return ChunkViewsOf(options_.plan, ids, [&](size_t param) -> const at::Tensor& { return tensors[param]; });
}

absl::Status PsClient::CopyIntoParams(const std::vector<size_t>& ids, const std::vector<TensorBuffer>& values,
                                      const std::vector<at::Tensor>& params) const {
  if (values.size() != ids.size()) {
    return absl::InternalError(absl::StrCat("a shard returned ", values.size(), " values for ", ids.size(), " keys"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const ChunkSpec& c = options_.plan.chunks[ids[i]];
    const at::Tensor& p = params[c.param];
    uint8_t* dst = static_cast<uint8_t*>(p.data_ptr()) + c.offset * p.element_size();
    if (IsNarrowFloat(values[i].dtype) && p.scalar_type() == at::kFloat && values[i].nbytes * 2 == c.bytes) {
      WidenElements(values[i].dtype, values[i].data, values[i].nbytes / 2, reinterpret_cast<float*>(dst));
      continue;
    }
    if (values[i].nbytes != c.bytes) {
      return absl::InternalError(
          absl::StrCat("a shard returned ", values[i].nbytes, " bytes for ", c.key, ", expected ", c.bytes));
    }
    // Usually the store wrote straight into the parameter (see ChunkViews
    // passed as destinations); copy only if it did not.
    if (values[i].data != dst) std::memcpy(dst, values[i].data, c.bytes);
  }
  return absl::OkStatus();
}

absl::Status PsClient::ForEachShard(const Route& route, const std::function<void(int, StatusCallback)>& call,
                                    bool every_shard) {
  FanOut calls;
  std::vector<int> involved;
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) {
    // A replicated table's shards that lead nothing (lost ones) are not
    // called, nor a pipeline stage's shards that hold none of its chunks.
    const bool pipelined = options_.whole_plan.num_shards > 0;
    if ((options_.plan.replicas == 0 && !pipelined) || !route.shard_chunks[s].empty() ||
        (every_shard && !route.lost[s])) {
      involved.push_back(s);
    }
  }
  calls.Add(static_cast<int>(involved.size()));
  for (int s : involved) {
    const absl::Time start = absl::Now();
    if (options_.activity != nullptr) options_.activity->ShardCallStarted(s);
    call(s, [&, s, start](absl::Status status) {
      if (options_.activity != nullptr) options_.activity->ShardCallEnded(s, absl::Now() - start, 0);
      calls.Done(ShardError(s, status));
    });
  }
  return calls.Wait();
}

absl::Status PsClient::InitTables(const std::vector<at::Tensor>& params, const TableConfig& config) {
  absl::Status s = CheckTensors(params, "parameters");
  if (!s.ok()) return s;
  CallOptions opts = NewCallOptions();
  opts.table_grant = options_.table_grant;
  // A replacement worker may join after a shard was lost: the tables are
  // made on those that are left (a repeat of an identical InitTable is kept).
  s = WithFailover([&](const Route& route) {
    std::vector<InitTableRequest> requests(shards_.size());
    std::vector<InitTableResponse> responses(shards_.size());
    return ForEachShard(
        route,
        [&](int shard, StatusCallback done) {
          InitTableOn(route, shard, params, config, route.routing, &requests[shard], &responses[shard], opts,
                      std::move(done));
        },
        /*every_shard=*/true);
  });
  if (s.ok() && replicated()) WatchRoutings(config);
  return s;
}

absl::Status PsClient::Pull(const std::vector<at::Tensor>& params, int64_t min_version, int64_t min_worker_steps) {
  absl::Status s = CheckTensors(params, "parameters");
  if (!s.ok()) return s;
  return WithFailover([&](const Route& route) {
    const CallOptions opts = NewCallOptions();
    std::vector<PullRequest> requests(shards_.size());
    std::vector<PullResponse> responses(shards_.size());
    std::vector<std::vector<TensorBuffer>> values(shards_.size());
    return ForEachShard(route, [&](int shard, StatusCallback done) {
      const std::vector<size_t>& ids = route.shard_chunks[shard];
      auto dest = ChunkViews(params, ids);
      if (!dest.ok()) return done(dest.status());
      values[shard] = std::move(*dest);
      PullRequest& req = Addressed(requests[shard], ids);
      req.set_min_version(min_version);
      req.set_min_worker_steps(min_worker_steps);
      route.shards[shard]->PullAsync(req, &responses[shard], &values[shard], opts,
                                [&, shard, done = std::move(done)](absl::Status st) {
                                  const auto& ids = route.shard_chunks[shard];
                                  if (st.ok() && shard == static_cast<int>(route.view_shard)) {
                                    RecordView(responses[shard].vacant_ranks());
                                  }
                                  if (st.ok()) st = CopyIntoParams(ids, values[shard], params);
                                  values[shard].clear();
                                  done(st);
                                });
    });
  });
}

absl::StatusOr<std::vector<TensorBuffer>> PsClient::WireChunks(const std::vector<at::Tensor>& grads) {
  std::vector<size_t> all(options_.plan.chunks.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  auto wire = ChunkViews(grads, all);
  if (wire.ok()) wire = ForWire(std::move(*wire), all);
  return wire;
}

absl::Status PsClient::Push(int64_t step, const std::vector<at::Tensor>& grads, double lr) {
  absl::Status s = CheckTensors(grads, "gradients");
  if (!s.ok()) return s;
  auto wire = WireChunks(grads);
  if (!wire.ok()) return wire.status();
  return WithFailover([&](const Route& route) {
    const CallOptions opts = NewCallOptions();
    std::vector<PushRequest> requests(shards_.size());
    std::vector<PushResponse> responses(shards_.size());
    return ForEachShard(route, [&](int shard, StatusCallback done) {
      const std::vector<size_t>& ids = route.shard_chunks[shard];
      std::vector<TensorBuffer> views;
      for (size_t id : ids) views.push_back((*wire)[id]);
      PushRequest& req = AddressedPush(requests[shard], ids, step, lr);
      route.shards[shard]->PushAsync(req, std::move(views), &responses[shard], opts, std::move(done));
    });
  });
}

absl::Status PsClient::PushPull(int64_t step, const std::vector<at::Tensor>& grads,
                                const std::vector<at::Tensor>& params, double lr) {
  absl::Status s = CheckTensors(grads, "gradients");
  if (s.ok()) s = CheckTensors(params, "parameters");
  if (!s.ok()) return s;
  auto wire = WireChunks(grads);
  if (!wire.ok()) return wire.status();
  return WithFailover([&](const Route& route) {
    const CallOptions opts = NewCallOptions();
    std::vector<PushPullRequest> requests(shards_.size());
    std::vector<PushPullResponse> responses(shards_.size());
    std::vector<std::vector<TensorBuffer>> values(shards_.size());
    return ForEachShard(route, [&](int shard, StatusCallback done) {
      const std::vector<size_t>& ids = route.shard_chunks[shard];
      std::vector<TensorBuffer> views;
      for (size_t id : ids) views.push_back((*wire)[id]);
      auto dest = ChunkViews(params, ids);
      if (!dest.ok()) return done(dest.status());
      values[shard] = std::move(*dest);
      PushPullRequest& req = AddressedPush(requests[shard], ids, step, lr);
      route.shards[shard]->PushPullAsync(req, std::move(views), &responses[shard], &values[shard], opts,
                                    [&, shard, done = std::move(done)](absl::Status st) {
                                      if (st.ok() && shard == static_cast<int>(route.view_shard)) {
                                        RecordView(responses[shard].vacant_ranks());
                                      }
                                      if (st.ok())
                                        st = CopyIntoParams(route.shard_chunks[shard], values[shard], params);
                                      values[shard].clear();
                                      done(st);
                                    });
    });
  });
}

std::vector<PsClient::RequestPart> PsClient::SplitRequests(const Route& route,
                                                           const std::vector<size_t>& params) const {
  std::vector<RequestPart> parts;
  for (size_t s = 0; s < shards_.size(); ++s) {
    size_t bytes = 0;
    for (size_t p : params) {
      for (size_t id : route.param_chunks[p][s]) {
        const size_t b = options_.plan.chunks[id].bytes;
        if (parts.empty() || parts.back().shard != s || (bytes > 0 && bytes + b > options_.max_request_bytes)) {
          parts.push_back(RequestPart{s, {}, false});
          bytes = 0;
        }
        parts.back().ids.push_back(id);
        bytes += b;
      }
    }
  }
  // The part holding the view chunk (the first key of its shard's Pull)
  // puts it first, so the shard reports that chunk's view: the same one for
  // every worker, whose buckets and parts are the same.
  for (RequestPart& part : parts) {
    auto at = std::find(part.ids.begin(), part.ids.end(), view_chunk_);
    if (at != part.ids.end()) {
      std::iter_swap(part.ids.begin(), at);
      part.has_view = true;
    }
  }
  return parts;
}

void PsClient::PushPullAsync(int64_t step, const std::vector<size_t>& params, const std::vector<at::Tensor>& grads,
                             const std::vector<at::Tensor>& intos, double lr, StatusCallback done) {
  // One request per part: a shard's chunks of the bucket, cut at
  // max_request_bytes of values, so a large bucket's values come back part
  // by part while its later parts still go out (upload and download
  // overlap on a full-duplex link).
  if (grads.size() != params.size() || intos.size() != params.size()) {
    return done(absl::InvalidArgumentError("one gradient and one destination per parameter"));
  }
  // position[p]: where parameter p is in `params`.
  std::vector<int> position(options_.plan.params.size(), -1);
  for (size_t k = 0; k < params.size(); ++k) {
    const size_t p = params[k];
    if (p >= position.size() || position[p] != -1) {
      return done(absl::InvalidArgumentError("unknown or repeated parameter index"));
    }
    position[p] = static_cast<int>(k);
    const ParameterSpec& spec = options_.plan.params[p];
    for (const at::Tensor* t : {&grads[k], &intos[k]}) {
      if (!t->defined() || !t->is_contiguous() || !t->device().is_cpu() ||
          std::vector<int64_t>(t->sizes().begin(), t->sizes().end()) != spec.shape || !TravelsAs(spec, *t)) {
        return done(absl::InvalidArgumentError(absl::StrCat("parameter ", spec.name,
                                                            ": gradient and destination must be contiguous CPU "
                                                            "tensors of the planned shape and dtype (or, "
                                                            "float32 under a narrow wire dtype, of the wire's)")));
      }
    }
  }
  auto state = std::make_shared<AsyncPushPull>();
  state->step = step;
  state->lr = lr;
  state->deadline = absl::Now() + options_.timeout;
  state->done = std::move(done);
  const std::shared_ptr<const Route> r = route();
  state->generation = r->generation;
  state->parts = SplitRequests(*r, params);
  const size_t n = state->parts.size();
  state->Reset(n);
  if (n == 0) return state->done(absl::OkStatus());
  const CallOptions opts = NewCallOptions();
  for (size_t k = 0; k < n; ++k) {
    const RequestPart& part = state->parts[k];
    const size_t s = part.shard;
    Activity* activity = options_.activity;
    // A part's call is timed from when its turn came, not while it waited
    // for one (shard_<i>/call_ms is the shard's latency, as seen here).
    auto sent = [state, k, s, activity] {
      state->sent[k] = absl::Now();
      if (activity != nullptr) activity->ShardCallStarted(static_cast<int>(s));
    };
    auto finish = [this, state, k, s, activity](absl::Status st) {
      Release(s);
      if (activity != nullptr) {
        activity->ShardCallEnded(static_cast<int>(s), absl::Now() - state->sent[k], state->bytes[k]);
      }
      PartDone(state, k, std::move(st));
    };
    auto grad_views =
        ChunkViewsOf(options_.plan, part.ids, [&](size_t p) -> const at::Tensor& { return grads[position[p]]; });
    auto dest =
        ChunkViewsOf(options_.plan, part.ids, [&](size_t p) -> const at::Tensor& { return intos[position[p]]; });
    if (!grad_views.ok() || !dest.ok()) {
      Admit(s, [sent, finish, st = grad_views.ok() ? dest.status() : grad_views.status()] {
        sent();
        finish(st);
      });
      continue;
    }
    state->values[k] = *dest;
    state->dest[k] = std::move(*dest);  // kept for a retry: the shard may write into values[k]'s
    AddressedPush(state->requests[k], part.ids, step, lr);
    // A narrow wire dtype: the part's gradients are narrowed when its turn
    // comes, on the thread that sends it (a gRPC thread once the shard's
    // requests_in_flight are taken), so the first request goes out after
    // one part's narrowing, not the whole bucket's, and the parts'
    // narrowing overlaps the requests in flight. Each chunk is in one part,
    // so its error feedback residual is touched by one thread per step.
    // The shard writes into the destination views (the `intos` tensors).
    ParameterStore* store = r->shards[s];
    Admit(s, [this, store, state, k, opts, sent, finish,
              views = std::make_shared<std::vector<TensorBuffer>>(std::move(*grad_views))]() mutable {
      absl::StatusOr<std::vector<TensorBuffer>> wire = ForWire(std::move(*views), state->parts[k].ids);
      sent();
      if (!wire.ok()) return finish(wire.status());
      for (const TensorBuffer& b : *wire) state->bytes[k] += 2 * static_cast<int64_t>(b.nbytes);
      state->wire[k] = *wire;  // as sent: a retry sends the same bytes
      store->PushPullAsync(state->requests[k], std::move(*wire), &state->responses[k], &state->values[k], opts, finish);
    });
  }
}

void PsClient::Admit(size_t s, std::function<void()> issue) {
  ShardTurns& t = *turns_[s];
  {
    absl::MutexLock lock(&t.mu);
    if (options_.max_in_flight_per_shard > 0 && t.in_flight >= options_.max_in_flight_per_shard) {
      t.waiting.push_back(std::move(issue));
      return;
    }
    ++t.in_flight;
  }
  issue();
}

void PsClient::Release(size_t s) {
  ShardTurns& t = *turns_[s];
  std::function<void()> next;
  {
    absl::MutexLock lock(&t.mu);
    if (t.waiting.empty()) {
      --t.in_flight;
      return;
    }
    next = std::move(t.waiting.front());  // its turn: the slot passes on
    t.waiting.pop_front();
  }
  next();
}

// ps_client_failover.cc addresses its retries and tables with these.
template PushPullRequest& PsClient::AddressedPush<PushPullRequest>(PushPullRequest&, const std::vector<size_t>&,
                                                                   int64_t, double) const;
template InitTableRequest& PsClient::Addressed<InitTableRequest>(InitTableRequest&, const std::vector<size_t>&) const;

}  // namespace pstrain
