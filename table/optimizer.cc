#include "table/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::Status NormalizeOptimizerConfig(OptimizerConfig* c) {
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.", field, " ", why));
  };
  if (c->kind() == OptimizerConfig::KIND_UNSPECIFIED) {
    return bad("kind", "is not set: use SGD, ADAM, ADAMW or ADAGRAD");
  }
  if (!OptimizerConfig::Kind_IsValid(c->kind())) return bad("kind", "is unknown");
  if (!(c->lr() > 0) || !std::isfinite(c->lr())) return bad("lr", "must be a positive number");
  if (c->weight_decay() < 0 || !std::isfinite(c->weight_decay())) {
    return bad("weight_decay", "must be >= 0");
  }
  switch (c->kind()) {
    case OptimizerConfig::SGD:
      if (c->momentum() < 0 || !std::isfinite(c->momentum())) return bad("momentum", "must be >= 0");
      if (c->dampening() < 0 || c->dampening() > 1) return bad("dampening", "must be in [0, 1]");
      if (c->nesterov() && (c->momentum() <= 0 || c->dampening() != 0)) {
        return bad("nesterov", "needs momentum > 0 and dampening 0 (as in PyTorch)");
      }
      break;
    case OptimizerConfig::ADAM:
    case OptimizerConfig::ADAMW:
      if (c->beta1() == 0) c->set_beta1(0.9);
      if (c->beta2() == 0) c->set_beta2(0.999);
      if (c->eps() == 0) c->set_eps(1e-8);
      if (c->beta1() < 0 || c->beta1() >= 1) return bad("beta1", "must be in [0, 1)");
      if (c->beta2() < 0 || c->beta2() >= 1) return bad("beta2", "must be in [0, 1)");
      if (!(c->eps() > 0)) return bad("eps", "must be > 0");
      break;
    case OptimizerConfig::ADAGRAD:
      if (c->eps() == 0) c->set_eps(1e-10);
      if (!(c->eps() > 0)) return bad("eps", "must be > 0");
      if (c->lr_decay() < 0) return bad("lr_decay", "must be >= 0");
      if (c->initial_accumulator_value() < 0) return bad("initial_accumulator_value", "must be >= 0");
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

int OptimizerStateSlots(OptimizerConfig::Kind kind) {
  switch (kind) {
    case OptimizerConfig::SGD: return 1;  // momentum buffer
    case OptimizerConfig::ADAM:
    case OptimizerConfig::ADAMW: return 2;  // exp_avg, exp_avg_sq
    case OptimizerConfig::ADAGRAD: return 1;  // sum of squares
    default: return 0;
  }
}

bool OptimizerUsesState(const OptimizerConfig& config) {
  if (config.kind() == OptimizerConfig::SGD) return config.momentum() != 0;
  return OptimizerStateSlots(config.kind()) > 0;
}

namespace {

// 1 if |x| is a finite number, else 0 (NaN compares false). An integer AND
// over these vectorizes, so the check rides along with the update's own
// pass over memory.
template <typename T>
inline unsigned Finite(T x) {
  return std::fabs(x) <= std::numeric_limits<T>::max() ? 1u : 0u;
}

// Element i of an array of T at any address (memcpy: an unaligned load,
// which vectorizes like an aligned one).
template <typename T>
struct Unaligned {
  const uint8_t* p;
  T operator[](size_t i) const {
    T x;
    std::memcpy(&x, p + i * sizeof(T), sizeof(T));
    return x;
  }
};

}  // namespace

template <typename T>
__attribute__((always_inline)) inline bool ApplyOptimizerImpl(const OptimizerConfig& c, int64_t step, const T* param,
                                                              T* out, const void* grad, T* const* state, size_t n,
                                                              double grad_scale) {
  const Unaligned<T> g{static_cast<const uint8_t*>(grad)};
  unsigned ok = 1;
  const T scale = static_cast<T>(grad_scale);
  const T lr = static_cast<T>(c.lr());
  const T wd = static_cast<T>(c.weight_decay());
  switch (c.kind()) {
    case OptimizerConfig::SGD: {
      const T mom = static_cast<T>(c.momentum());
      const T damp = static_cast<T>(1.0 - c.dampening());
      T* buf = state[0];
      if (mom == 0) {
        for (size_t i = 0; i < n; ++i) {
          const T p = param[i];
          const T o = p - lr * (g[i] * scale + wd * p);
          out[i] = o;
          ok &= Finite(o);
        }
      } else if (step == 1) {
        // PyTorch starts the momentum buffer as a copy of the first gradient.
        for (size_t i = 0; i < n; ++i) {
          const T p = param[i];
          const T d = g[i] * scale + wd * p;
          buf[i] = d;
          const T o = p - lr * (c.nesterov() ? d + mom * d : d);
          out[i] = o;
          ok &= Finite(o) & Finite(d);
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          const T p = param[i];
          const T d = g[i] * scale + wd * p;
          const T b = mom * buf[i] + damp * d;
          buf[i] = b;
          const T o = p - lr * (c.nesterov() ? d + mom * b : b);
          out[i] = o;
          ok &= Finite(o) & Finite(b);
        }
      }
      break;
    }
    case OptimizerConfig::ADAM:
    case OptimizerConfig::ADAMW: {
      const double b1 = c.beta1(), b2 = c.beta2();
      const T beta1 = static_cast<T>(b1), beta2 = static_cast<T>(b2);
      const T bc1 = static_cast<T>(1.0 - std::pow(b1, static_cast<double>(step)));
      const T bc2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(step))));
      const T step_size = lr / bc1;
      const T eps = static_cast<T>(c.eps());
      const bool decoupled = c.kind() == OptimizerConfig::ADAMW;
      const T decay = static_cast<T>(1.0 - c.lr() * c.weight_decay());
      T* m = state[0];
      T* v = state[1];
      for (size_t i = 0; i < n; ++i) {
        T p = param[i];
        T d = g[i] * scale;
        if (decoupled) {
          p *= decay;
        } else {
          d += wd * p;
        }
        const T mi = beta1 * m[i] + (1 - beta1) * d;
        const T vi = beta2 * v[i] + (1 - beta2) * d * d;
        m[i] = mi;
        v[i] = vi;
        const T denom = std::sqrt(vi) / bc2_sqrt + eps;
        const T o = p - step_size * mi / denom;
        out[i] = o;
        ok &= Finite(o) & Finite(vi);
      }
      break;
    }
    case OptimizerConfig::ADAGRAD: {
      const T clr = static_cast<T>(c.lr() / (1.0 + static_cast<double>(step - 1) * c.lr_decay()));
      const T eps = static_cast<T>(c.eps());
      T* sum = state[0];
      for (size_t i = 0; i < n; ++i) {
        const T p = param[i];
        const T d = g[i] * scale + wd * p;
        const T si = sum[i] + d * d;
        sum[i] = si;
        const T o = p - clr * d / (std::sqrt(si) + eps);
        out[i] = o;
        ok &= Finite(o) & Finite(si);
      }
      break;
    }
    default:
      break;
  }
  return ok != 0;
}

namespace optimizer_internal {

// The float32 loops run over every pushed gradient: AVX2 where the CPU has
// it, chosen once (the build targets any x86-64). Not FMA: the two
// versions give bit-identical results (optimizer_test checks), so a job's
// values do not depend on the machine, which SYNC training's determinism
// relies on.
bool ApplyFloatPortable(const OptimizerConfig& c, int64_t step, const float* param, float* out, const void* grad,
                        float* const* state, size_t n, double grad_scale) {
  return ApplyOptimizerImpl<float>(c, step, param, out, grad, state, n, grad_scale);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) bool ApplyFloatAvx2(const OptimizerConfig& c, int64_t step, const float* param,
                                                    float* out, const void* grad, float* const* state, size_t n,
                                                    double grad_scale) {
  return ApplyOptimizerImpl<float>(c, step, param, out, grad, state, n, grad_scale);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#else
bool ApplyFloatAvx2(const OptimizerConfig& c, int64_t step, const float* param, float* out, const void* grad,
                    float* const* state, size_t n, double grad_scale) {
  return ApplyFloatPortable(c, step, param, out, grad, state, n, grad_scale);
}

bool HasAvx2() { return false; }
#endif

}  // namespace optimizer_internal

template <typename T>
bool ApplyOptimizer(const OptimizerConfig& c, int64_t step, const T* param, T* out, const void* grad,
                    T* const* state, size_t n, double grad_scale) {
  if constexpr (std::is_same_v<T, float>) {
    return optimizer_internal::HasAvx2()
               ? optimizer_internal::ApplyFloatAvx2(c, step, param, out, grad, state, n, grad_scale)
               : optimizer_internal::ApplyFloatPortable(c, step, param, out, grad, state, n, grad_scale);
  } else {
    return ApplyOptimizerImpl<T>(c, step, param, out, grad, state, n, grad_scale);
  }
}

template bool ApplyOptimizer<float>(const OptimizerConfig&, int64_t, const float*, float*,
                                    const void*, float* const*, size_t, double);
template bool ApplyOptimizer<double>(const OptimizerConfig&, int64_t, const double*, double*,
                                     const void*, double* const*, size_t, double);

}  // namespace pstrain
