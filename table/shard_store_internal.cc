#include "table/shard_store_internal.h"

#include <algorithm>
#include <cstring>

namespace pstrain {

namespace {

template <typename T>
void Fill(const TensorBuffer& t, double value) {
  T* p = reinterpret_cast<T*>(t.MutableData());
  std::fill(p, p + t.NumElements(), static_cast<T>(value));
}

}  // namespace

namespace shard_internal {

absl::Status Unavailable() {
  return absl::UnavailableError("parameter shard is shutting down; retry on its replacement");
}

// PullRequest.value_dtype: as stored, float32, or a narrow wire dtype.
absl::Status CheckValueDtype(DataType dtype) {
  if (dtype == DT_INVALID || dtype == DT_FLOAT32 || IsNarrowFloat(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("value_dtype ", DataTypeName(dtype),
                                                 " is not a wire dtype (float32, bfloat16 or float16)"));
}

// Gradients that came narrow (the job's wire_dtype) become float32 before
// anything else looks at them: the table keeps float32 values and state.
absl::Status WidenNarrowGradients(std::vector<TensorBuffer>& grads) {
  for (TensorBuffer& g : grads) {
    if (!IsNarrowFloat(g.dtype)) continue;
    absl::Status valid = ValidateTensorBuffer(g, "a narrow gradient");
    if (!valid.ok()) return valid;
    absl::StatusOr<TensorBuffer> wide = WidenToFloat32(g);
    if (!wide.ok()) return wide.status();
    g = std::move(*wide);
  }
  return absl::OkStatus();
}

bool IsFinite(const TensorBuffer& t) {
  return t.known_finite || AllFinite(t);
}

absl::StatusOr<TensorBuffer> Zeros(DataType dtype, const std::vector<int64_t>& shape) {
  absl::StatusOr<TensorBuffer> t = TensorBuffer::TryAllocate(dtype, shape);
  if (t.ok() && t->nbytes > 0) std::memset(t->MutableData(), 0, t->nbytes);
  return t;
}

absl::StatusOr<TensorBuffer> CopyBuffer(const TensorBuffer& from) {
  absl::StatusOr<TensorBuffer> t = TensorBuffer::TryAllocate(from.dtype, from.shape);
  if (t.ok() && t->nbytes > 0) std::memcpy(t->MutableData(), from.data, from.nbytes);
  return t;
}

absl::StatusOr<std::vector<TensorBuffer>> NewStateSet(const OptimizerConfig& optimizer, DataType dtype,
                                                      const std::vector<int64_t>& shape) {
  std::vector<TensorBuffer> set;
  for (int k = 0; k < OptimizerStateSlots(optimizer.kind()); ++k) {
    absl::StatusOr<TensorBuffer> z = Zeros(dtype, shape);
    if (!z.ok()) return z.status();
    set.push_back(std::move(*z));
  }
  if (optimizer.kind() == OptimizerConfig::ADAGRAD && !set.empty()) {
    if (dtype == DT_FLOAT32) {
      Fill<float>(set[0], optimizer.initial_accumulator_value());
    } else {
      Fill<double>(set[0], optimizer.initial_accumulator_value());
    }
  }
  return set;
}

namespace {

template <typename T>
bool ComputeUpdateOf(const OptimizerConfig& config, int64_t step, const TensorBuffer& value, const TensorBuffer& grad,
                     const std::vector<TensorBuffer>& state, double scale, TensorBuffer* out) {
  const T* param = reinterpret_cast<const T*>(value.data);
  T* next = reinterpret_cast<T*>(out->MutableData());
  std::vector<T*> base, at;
  for (const TensorBuffer& b : state) base.push_back(reinterpret_cast<T*>(b.MutableData()));
  at.resize(base.size());
  bool ok = true;
  // Elementwise, so run by run (the gradient may be in pieces) it is the
  // same arithmetic as in one pass.
  ForEachRun(grad, sizeof(T), [&](size_t first, const uint8_t* g, size_t n) {
    for (size_t k = 0; k < base.size(); ++k) at[k] = base[k] + first;
    ok = ApplyOptimizer<T>(config, step, param + first, next + first, g, at.data(), n, scale) && ok;
  });
  return ok;
}

}  // namespace

bool ComputeUpdate(const OptimizerConfig& config, int64_t step, const TensorBuffer& value, const TensorBuffer& grad,
                   const std::vector<TensorBuffer>& state, double scale, TensorBuffer* out) {
  if (value.dtype == DT_FLOAT32) return ComputeUpdateOf<float>(config, step, value, grad, state, scale, out);
  return ComputeUpdateOf<double>(config, step, value, grad, state, scale, out);
}

void ResetStateSet(const OptimizerConfig& optimizer, std::vector<TensorBuffer>& set) {
  for (size_t k = 0; k < set.size(); ++k) {
    const TensorBuffer& b = set[k];
    const double init = optimizer.kind() == OptimizerConfig::ADAGRAD && k == 0 ? optimizer.initial_accumulator_value() : 0;
    if (b.dtype == DT_FLOAT32) {
      Fill<float>(b, init);
    } else {
      Fill<double>(b, init);
    }
  }
}

absl::Status CheckStagePusher(const ShardStore::Chunk& c, int64_t worker) {
  if (c.stages <= 1) return absl::OkStatus();
  if (c.pending.load(std::memory_order_acquire) || (worker >= 0 && !c.stage_known.load(std::memory_order_acquire))) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", Quote(c.key), "' of a pipelined job has no ",
                     c.pending.load() ? "value" : "stage", " yet: the workers of its stage call InitTable first"));
  }
  if (worker >= 0 && !c.PushedBy(static_cast<size_t>(worker))) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Quote(c.key), "' belongs to stage ", c.stage.load(),
                                                   " of a pipelined job; worker ", worker, " is of stage ",
                                                   worker % c.stages, " and pushes its own stage's keys only"));
  }
  return absl::OkStatus();
}

uint32_t PipelineStages(const TableConfig& config) { return std::max<uint32_t>(1, config.pipeline_stages()); }

namespace {
bool PerWorkerState(const TableConfig& config) {
  return config.consistency() != SYNC && !config.shared_async_state();
}
}  // namespace

uint32_t StateSets(const TableConfig& config) {
  return PerWorkerState(config) ? config.num_workers() / PipelineStages(config) : 1;
}

size_t StateSetOf(const TableConfig& config, uint32_t worker) {
  return PerWorkerState(config) ? worker / PipelineStages(config) : 0;
}

uint64_t WorstCaseBytes(const TableConfig& config, uint64_t value_bytes) {
  const uint64_t slots = static_cast<uint64_t>(OptimizerStateSlots(config.optimizer().kind()));
  const uint64_t sets = StateSets(config);
  const uint64_t accum = config.consistency() == SYNC ? 1 : 0;
  return value_bytes * (2 + slots * sets + accum);
}

bool StepComplete(const ShardStore::Chunk& c, const std::vector<bool>& active, int worker) {
  if (c.arrivals == 0 && worker < 0) return false;
  for (size_t r = 0; r < active.size(); ++r) {
    if (active[r] && c.PushedBy(r) && !c.arrived[r] && static_cast<int>(r) != worker) return false;
  }
  return true;
}

int64_t ActiveClock(const ShardStore::Chunk& c, const std::vector<bool>& active) {
  int64_t lo = INT64_MAX, hi = -1;
  for (size_t r = 0; r < c.last_step.size(); ++r) {
    hi = std::max(hi, c.last_step[r]);
    if (r < active.size() && active[r] && c.PushedBy(r)) lo = std::min(lo, c.last_step[r]);
  }
  return lo == INT64_MAX ? hi : lo;
}

absl::StatusOr<TensorBuffer> TakeSpare(ShardStore::Chunk& c) {
  if (c.spare.data != nullptr && c.spare.owner.use_count() == 1) {
    TensorBuffer out = std::move(c.spare);
    c.spare = TensorBuffer();
    return out;
  }
  c.spare = TensorBuffer();
  return TensorBuffer::TryAllocate(c.dtype, c.shape);
}

absl::Status EnsureStateSet(ShardStore::Chunk& c, size_t k, const OptimizerConfig& optimizer) {
  if (!c.state[k].empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<TensorBuffer>> set = NewStateSet(optimizer, c.dtype, c.shape);
  if (!set.ok()) return set.status();
  c.state[k] = std::move(*set);
  return absl::OkStatus();
}

void CompleteSyncStep(ShardStore::Table& table, ShardStore::Chunk& c, TensorBuffer& value,
                      const std::vector<bool>& active) {
  OptimizerConfig optimizer = table.config.optimizer();
  if (c.pending_lr > 0) optimizer.set_lr(c.pending_lr);
  // The mean over the batches the step's pushes carried: each rank's own,
  // and those of vacant ranks that active ones covered (see
  // PushRequest.extra_batches). When every arrival was empty there is
  // nothing to apply: the values stay and the step still completes.
  if (c.batches == 0) {
    c.spare = std::move(value);
  } else if (ComputeUpdate(optimizer, c.optimizer_step[0] + 1, c.value, c.accum, c.state[0],
                           1.0 / c.batches, &value)) {
    TensorBuffer old = std::move(c.value);
    c.value = std::move(value);
    if (old.owner.use_count() == 1) c.spare = std::move(old);  // else a reader still has it
    ++c.optimizer_step[0];
  } else {
    ++table.updates_nonfinite;
    ResetStateSet(optimizer, c.state[0]);
    c.optimizer_step[0] = 0;
    c.spare = std::move(value);
  }
  std::memset(c.accum.MutableData(), 0, c.accum.nbytes);
  std::fill(c.arrived.begin(), c.arrived.end(), false);
  c.arrivals = 0;
  c.batches = 0;
  c.vacant_at_version.clear();
  for (size_t r = 0; r < active.size(); ++r) {
    if (!active[r]) c.vacant_at_version.push_back(static_cast<uint32_t>(r));
  }
  c.pending_lr = 0;
  MarkChanged(c, OptimizerUsesState(optimizer) ? 0 : -1);
  c.version.store(c.version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

}  // namespace shard_internal

namespace {

// In [lo, hi], and not NaN.
bool InRange(double x, double lo, double hi) { return x >= lo && x <= hi; }

}  // namespace

absl::Status ValidateTableConfig(TableConfig* config) {
  absl::Status s = NormalizeOptimizerConfig(config->mutable_optimizer());
  if (!s.ok()) return s;
  const OptimizerConfig& o = config->optimizer();
  auto bad = [](const char* field, const char* range) {
    return absl::InvalidArgumentError(absl::StrCat("config.optimizer.", field, " must be in ", range));
  };
  // Ranges beyond which no training converges; values outside them are a
  // mistake or an attack, and lead to non-finite parameters.
  if (!InRange(o.lr(), 1e-12, 100)) return bad("lr", "(0, 100]");
  if (!InRange(o.weight_decay(), 0, 1)) return bad("weight_decay", "[0, 1]");
  if (!InRange(o.momentum(), 0, 0.9999)) return bad("momentum", "[0, 1)");
  if (!InRange(o.dampening(), 0, 1)) return bad("dampening", "[0, 1]");
  if (!InRange(o.beta1(), 0, 0.9999)) return bad("beta1", "[0, 1)");
  if (!InRange(o.beta2(), 0, 0.999999)) return bad("beta2", "[0, 1)");
  if (!InRange(o.eps(), 0, 1)) return bad("eps", "[0, 1]");
  if (!InRange(o.lr_decay(), 0, 1)) return bad("lr_decay", "[0, 1]");
  if (!InRange(o.initial_accumulator_value(), 0, 1e6)) return bad("initial_accumulator_value", "[0, 1e6]");
  if (config->consistency() == CONSISTENCY_UNSPECIFIED || !Consistency_IsValid(config->consistency())) {
    return absl::InvalidArgumentError("config.consistency must be ASYNC, SYNC or SSP");
  }
  if (config->num_workers() == 0 || config->num_workers() > kMaxTableWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("config.num_workers must be between 1 and ", kMaxTableWorkers));
  }
  const uint32_t stages = config->pipeline_stages();
  if (stages > 1 && (stages > config->num_workers() || config->num_workers() % stages != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("config.pipeline_stages (", stages,
                                                   ") must divide config.num_workers (", config->num_workers(), ")"));
  }
  if (config->staleness() > 1000000) {
    return absl::InvalidArgumentError("config.staleness must be at most 1000000");
  }
  if (!NonFinitePolicy_IsValid(config->nonfinite())) {
    return absl::InvalidArgumentError("config.nonfinite is not a known policy");
  }
  return absl::OkStatus();
}

}  // namespace pstrain
