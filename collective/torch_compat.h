// The one place where pstrain meets differences between LibTorch versions
// (Debian's 1.13, Debian 13's 2.6, the pip wheels' 2.x), keyed on
// TORCH_VERSION_*. Code elsewhere uses these names and no version checks.
#ifndef PSTRAIN_COLLECTIVE_TORCH_COMPAT_H_
#define PSTRAIN_COLLECTIVE_TORCH_COMPAT_H_

#include <torch/csrc/api/include/torch/version.h>

// c10d::Store::clone() (a thread-safe handle to the same store) became a
// pure virtual in 2.5; a Store subclass must implement it from then on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define PSTRAIN_C10D_STORE_HAS_CLONE 1
#else
#define PSTRAIN_C10D_STORE_HAS_CLONE 0
#endif

#endif  // PSTRAIN_COLLECTIVE_TORCH_COMPAT_H_
