#include "common/malloc_tuning.h"

#include <malloc.h>

namespace pstrain {

void KeepBulkBuffersMapped() {
  // Blocks below 512 MiB come from the heap, not from mmap ...
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  // ... and freed memory is not trimmed back to the kernel below 1 GiB.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace pstrain
