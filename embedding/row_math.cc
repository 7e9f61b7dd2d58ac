#include "embedding/row_math.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

constexpr uint32_t kMaxDim = 4096;
constexpr uint32_t kMaxVirtualShards = 1 << 20;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// A uniform float in (0, 1) from the top 24 bits of a mixed counter.
float Unit(uint64_t bits) { return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f); }

bool InRange(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

absl::Status Field(absl::string_view table, absl::string_view field, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("embedding table '", table.substr(0, 64), "': ", field, " must be ", want));
}

}  // namespace

uint64_t TableSalt(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

absl::Status NormalizeEmbeddingConfig(EmbeddingTableConfig* c) {
  const std::string& t = c->name();
  if (t.empty() || t.size() > 64) return Field(t, "name", "1 to 64 characters");
  if (c->dim() < 1 || c->dim() > kMaxDim) return Field(t, "dim", "in 1..4096");
  if (c->virtual_shards() == 0) c->set_virtual_shards(1024);
  if (c->virtual_shards() > kMaxVirtualShards) return Field(t, "virtual_shards", "at most 1048576");
  EmbeddingOptimizer* o = c->mutable_optimizer();
  switch (o->kind()) {
    case EmbeddingOptimizer::SGD:
      break;
    case EmbeddingOptimizer::ADAGRAD:
      if (o->eps() == 0) o->set_eps(1e-10);
      break;
    case EmbeddingOptimizer::ROWWISE_ADAGRAD:
      if (o->eps() == 0) o->set_eps(1e-8);
      break;
    case EmbeddingOptimizer::LAZY_ADAM:
      if (o->eps() == 0) o->set_eps(1e-8);
      if (o->beta1() == 0) o->set_beta1(0.9);
      if (o->beta2() == 0) o->set_beta2(0.999);
      break;
    case EmbeddingOptimizer::FTRL:
      if (o->ftrl_beta() == 0) o->set_ftrl_beta(1.0);
      break;
    default:
      return Field(t, "optimizer", "one of sgd, rowwise_adagrad, adagrad, lazy_adam, ftrl");
  }
  if (!InRange(o->lr(), 1e-12, 100)) return Field(t, "optimizer.lr", "in (0, 100]");
  if (!InRange(o->eps(), 0, 1)) return Field(t, "optimizer.eps", "in [0, 1]");
  if (!InRange(o->beta1(), 0, 0.999999) || !InRange(o->beta2(), 0, 0.999999)) {
    return Field(t, "optimizer.beta1/beta2", "in [0, 1)");
  }
  if (!InRange(o->initial_accumulator_value(), 0, 1e6)) {
    return Field(t, "optimizer.initial_accumulator_value", "in [0, 1e6]");
  }
  if (!InRange(o->ftrl_beta(), 0, 1e6) || !InRange(o->ftrl_l1(), 0, 1e6) || !InRange(o->ftrl_l2(), 0, 1e6)) {
    return Field(t, "optimizer.ftrl_beta/l1/l2", "in [0, 1e6]");
  }
  const EmbeddingInitializer::Kind ik = c->initializer().kind();
  if (ik != EmbeddingInitializer::KIND_UNSPECIFIED && ik != EmbeddingInitializer::UNIFORM &&
      ik != EmbeddingInitializer::NORMAL && ik != EmbeddingInitializer::ZEROS) {
    return Field(t, "initializer", "one of uniform, normal, zeros");
  }
  if (ik == EmbeddingInitializer::KIND_UNSPECIFIED) c->mutable_initializer()->set_kind(EmbeddingInitializer::UNIFORM);
  if (!InRange(c->initializer().scale(), 0, 1e3)) return Field(t, "initializer.scale", "in [0, 1000]");
  if (c->initializer().scale() == 0) c->mutable_initializer()->set_scale(1.0 / std::sqrt(c->dim()));
  if (!InRange(c->admission().probability(), 0, 1)) return Field(t, "admission.probability", "in [0, 1]");
  if (c->admission().min_count() > 65535) return Field(t, "admission.min_count", "at most 65535");
  if (c->eviction().ttl_steps() < 0) return Field(t, "eviction.ttl_steps", ">= 0");
  if (c->eviction().max_memory_mb() > (uint64_t{1} << 30)) return Field(t, "eviction.max_memory_mb", "at most 2^30");
  if (c->nonfinite() != NONFINITE_REJECT && c->nonfinite() != NONFINITE_SKIP) {
    return Field(t, "nonfinite", "reject or skip");
  }
  return absl::OkStatus();
}

int SlotFloats(EmbeddingOptimizer::Kind kind, int dim) {
  switch (kind) {
    case EmbeddingOptimizer::ADAGRAD:
      return dim;
    case EmbeddingOptimizer::ROWWISE_ADAGRAD:
      return 1;
    case EmbeddingOptimizer::LAZY_ADAM:
    case EmbeddingOptimizer::FTRL:
      return 2 * dim;
    default:
      return 0;
  }
}

void InitRow(const EmbeddingTableConfig& config, uint64_t salt, int64_t id, float* value, float* slots) {
  const int dim = static_cast<int>(config.dim());
  const uint64_t base = MixId(salt ^ MixId(config.seed() + kGolden)) ^ MixId(static_cast<uint64_t>(id));
  const float scale = static_cast<float>(config.initializer().scale());
  switch (config.initializer().kind()) {
    case EmbeddingInitializer::ZEROS:
      for (int j = 0; j < dim; ++j) value[j] = 0.0f;
      break;
    case EmbeddingInitializer::NORMAL:
      // Box-Muller on two counters per element (the second value is not
      // reused, so element j depends on j alone).
      for (int j = 0; j < dim; ++j) {
        const float u1 = Unit(MixId(base + (2 * j + 1) * kGolden));
        const float u2 = Unit(MixId(base + (2 * j + 2) * kGolden));
        value[j] = scale * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
      }
      break;
    default:
      for (int j = 0; j < dim; ++j) value[j] = scale * (2.0f * Unit(MixId(base + (j + 1) * kGolden)) - 1.0f);
  }
  const EmbeddingOptimizer& o = config.optimizer();
  const int n = SlotFloats(o.kind(), dim);
  const float acc = static_cast<float>(o.initial_accumulator_value());
  for (int j = 0; j < n; ++j) slots[j] = 0.0f;
  if (o.kind() == EmbeddingOptimizer::ADAGRAD || o.kind() == EmbeddingOptimizer::ROWWISE_ADAGRAD) {
    for (int j = 0; j < n; ++j) slots[j] = acc;
  } else if (o.kind() == EmbeddingOptimizer::FTRL) {
    for (int j = dim; j < n; ++j) slots[j] = acc;  // n; z stays 0
  }
}

namespace {

// Each kernel writes the new value to `w` and new slots to `s`, which the
// caller has copied from the row (so a non-finite result can be dropped).
void Sgd(const EmbeddingOptimizer& o, const float* g, float scale, int dim, float* w) {
  const float lr = static_cast<float>(o.lr());
  for (int j = 0; j < dim; ++j) w[j] -= lr * (g[j] * scale);
}

void Adagrad(const EmbeddingOptimizer& o, const float* g, float scale, int dim, float* w, float* sum) {
  const float lr = static_cast<float>(o.lr()), eps = static_cast<float>(o.eps());
  for (int j = 0; j < dim; ++j) {
    const float gj = g[j] * scale;
    sum[j] += gj * gj;
    w[j] -= lr * (gj / (std::sqrt(sum[j]) + eps));
  }
}

void RowwiseAdagrad(const EmbeddingOptimizer& o, const float* g, float scale, int dim, float* w, float* acc) {
  double sq = 0;
  for (int j = 0; j < dim; ++j) sq += static_cast<double>(g[j] * scale) * (g[j] * scale);
  acc[0] += static_cast<float>(sq / dim);
  const float rate = static_cast<float>(o.lr() / (std::sqrt(static_cast<double>(acc[0])) + o.eps()));
  for (int j = 0; j < dim; ++j) w[j] -= rate * (g[j] * scale);
}

// torch.optim.SparseAdam (1.13), restricted to one row.
void LazyAdam(const EmbeddingOptimizer& o, int64_t step, const float* g, float scale, int dim, float* w, float* m,
              float* v) {
  const float b1 = static_cast<float>(o.beta1()), b2 = static_cast<float>(o.beta2());
  const float eps = static_cast<float>(o.eps());
  const double bc1 = 1 - std::pow(o.beta1(), static_cast<double>(step));
  const double bc2 = 1 - std::pow(o.beta2(), static_cast<double>(step));
  const float step_size = static_cast<float>(o.lr() * std::sqrt(bc2) / bc1);
  for (int j = 0; j < dim; ++j) {
    const float gj = g[j] * scale;
    m[j] += (gj - m[j]) * (1 - b1);
    v[j] += (gj * gj - v[j]) * (1 - b2);
    w[j] += -step_size * (m[j] / (std::sqrt(v[j]) + eps));
  }
}

// FTRL-Proximal per coordinate: z accumulates the gradient less the proximal
// pull, n the squared gradients, and w is z's closed-form solution.
void Ftrl(const EmbeddingOptimizer& o, const float* g, float scale, int dim, float* w, float* z, float* n) {
  const double alpha = o.lr(), beta = o.ftrl_beta(), l1 = o.ftrl_l1(), l2 = o.ftrl_l2();
  for (int j = 0; j < dim; ++j) {
    const double gj = static_cast<double>(g[j]) * scale;
    const double n_new = n[j] + gj * gj;
    const double sigma = (std::sqrt(n_new) - std::sqrt(static_cast<double>(n[j]))) / alpha;
    const double zj = z[j] + gj - sigma * w[j];
    z[j] = static_cast<float>(zj);
    n[j] = static_cast<float>(n_new);
    w[j] = std::abs(zj) <= l1
               ? 0.0f
               : static_cast<float>(-(zj - std::copysign(l1, zj)) / ((beta + std::sqrt(n_new)) / alpha + l2));
  }
}

bool AllFinite(const float* x, int n) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) acc += x[j] * 0.0f;  // NaN iff some x[j] is NaN or Inf
  return acc == 0.0f;
}

}  // namespace

bool ApplyRowUpdate(const EmbeddingTableConfig& config, int64_t step, const float* grad, double grad_scale,
                    float* value, float* slots) {
  const int dim = static_cast<int>(config.dim());
  const EmbeddingOptimizer& o = config.optimizer();
  const int ns = SlotFloats(o.kind(), dim);
  thread_local std::vector<float> scratch;
  scratch.assign(value, value + dim);
  scratch.insert(scratch.end(), slots, slots + ns);
  float* w = scratch.data();
  float* s = w + dim;
  const float scale = static_cast<float>(grad_scale);
  switch (o.kind()) {
    case EmbeddingOptimizer::SGD:
      Sgd(o, grad, scale, dim, w);
      break;
    case EmbeddingOptimizer::ADAGRAD:
      Adagrad(o, grad, scale, dim, w, s);
      break;
    case EmbeddingOptimizer::ROWWISE_ADAGRAD:
      RowwiseAdagrad(o, grad, scale, dim, w, s);
      break;
    case EmbeddingOptimizer::LAZY_ADAM:
      LazyAdam(o, step, grad, scale, dim, w, s, s + dim);
      break;
    case EmbeddingOptimizer::FTRL:
      Ftrl(o, grad, scale, dim, w, s, s + dim);
      break;
    default:
      return false;
  }
  if (!AllFinite(scratch.data(), dim + ns)) return false;
  std::copy(w, w + dim, value);
  std::copy(s, s + ns, slots);
  return true;
}

}  // namespace pstrain
