// The one place where pstrain meets differences between LibTorch versions
// (Debian's 1.13, Debian 13's 2.6, the pip wheels' 2.x), keyed on
// TORCH_VERSION_*. Code elsewhere uses these names and no version checks.
#ifndef PSTRAIN_COMMON_TORCH_COMPAT_H_
#define PSTRAIN_COMMON_TORCH_COMPAT_H_

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/api/include/torch/version.h>

// c10d::Store::clone() (a thread-safe handle to the same store) became a
// pure virtual in 2.8 (pytorch#150966); a Store subclass must implement it
// from then on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define PSTRAIN_C10D_STORE_HAS_CLONE 1
#else
#define PSTRAIN_C10D_STORE_HAS_CLONE 0
#endif

// at::_fused_sgd_: SGD for a list of tensors in one multi-tensor kernel,
// which skips the whole update on the device when its found_inf is 1. CUDA
// from 2.2, the CPU from 2.4 (pytorch#123629): used from 2.4 on, so the CPU
// tests run the code the GPUs run.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define PSTRAIN_HAS_FUSED_SGD 1
#include <ATen/ops/_fused_sgd.h>
#else
#define PSTRAIN_HAS_FUSED_SGD 0
#endif

// at::_fused_adam_ / _fused_adamw_: the same for Adam and AdamW, counting
// steps in float32 tensors. CUDA from 2.0, the CPU from 2.4: used from 2.4
// on, as fused SGD.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define PSTRAIN_HAS_FUSED_ADAM 1
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#else
#define PSTRAIN_HAS_FUSED_ADAM 0
#endif

namespace pstrain {

// Autocast (mixed precision) for one device type, on this thread: 2.4 gave
// every device type one pair of functions; before, CUDA and the CPU had
// their own.
inline void SetAutocast(c10::DeviceType type, bool enabled, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
  if (!enabled) at::autocast::clear_cache();
}

// CPU autocast to float16 (besides bfloat16) came with 2.2 (pytorch#112484);
// before, the CPU's matmuls and convolutions had no float16 kernels. CUDA
// autocast has always had float16.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
inline constexpr bool kCpuAutocastHasFp16 = true;
#else
inline constexpr bool kCpuAutocastHasFp16 = false;
#endif

inline constexpr bool kHasFusedSgd = PSTRAIN_HAS_FUSED_SGD;

// One SGD step of `params` (one dtype, one device, contiguous) unless
// `found_inf` (a float32 scalar on their device) is 1, decided on the
// device: PyTorch's SGD arithmetic (momentum, dampening, Nesterov, weight
// decay; `bufs` empty when momentum is 0, else past their first update).
// Returns false, having done nothing, where this LibTorch has no fused SGD.
inline bool FusedSgdUnlessFound(at::TensorList params, at::TensorList grads, at::TensorList bufs, double weight_decay,
                                double momentum, double lr, double dampening, bool nesterov,
                                const at::Tensor& found_inf) {
#if PSTRAIN_HAS_FUSED_SGD
  at::_fused_sgd_(params, grads, bufs, weight_decay, momentum, lr, dampening, nesterov, /*maximize=*/false,
                  /*is_first_step=*/false, /*grad_scale=*/{}, found_inf);
  return true;
#else
  (void)params, (void)grads, (void)bufs, (void)weight_decay, (void)momentum, (void)lr, (void)dampening,
      (void)nesterov, (void)found_inf;
  return false;
#endif
}

inline constexpr bool kHasFusedAdam = PSTRAIN_HAS_FUSED_ADAM;

// One Adam (or, `decoupled`, AdamW) step of `params` (one dtype, one device,
// contiguous) unless `found_inf` (a float32 scalar on their device) is 1:
// PyTorch's arithmetic (L2 weight decay for Adam, decoupled for AdamW; no
// amsgrad). `steps[i]` is parameter i's update count, this one included (a
// float32 scalar on the device; the kernel reads it, the caller counts).
// Returns false, having done nothing, where this LibTorch has no fused Adam.
inline bool FusedAdamUnlessFound(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                 at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1,
                                 double beta2, double weight_decay, double eps, bool decoupled,
                                 const at::Tensor& found_inf) {
#if PSTRAIN_HAS_FUSED_ADAM
  if (decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/{}, found_inf);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                     weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/{}, found_inf);
  }
  return true;
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1, (void)beta2,
      (void)weight_decay, (void)eps, (void)decoupled, (void)found_inf;
  return false;
#endif
}

// c10d::TCPStoreOptions::useLibUV (2.2 on; true by default from 2.4) picks
// a libuv server that a LibTorch built without libuv (Debian's 2.6) refuses
// at start: the classic server is plenty for a rendezvous. Detected by the
// member, not the version, so either kind of build works.
template <typename Options>
auto UseClassicTcpStore(Options& o, int) -> decltype(o.useLibUV = false, void()) {
  o.useLibUV = false;
}
template <typename Options>
void UseClassicTcpStore(Options&, long) {}
template <typename Options>
void UseClassicTcpStore(Options& o) {
  UseClassicTcpStore(o, 0);
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_TORCH_COMPAT_H_
