// Process-wide allocator settings for processes that move tensor-sized
// buffers every step (shards and workers).
#ifndef PSTRAIN_COMMON_MALLOC_TUNING_H_
#define PSTRAIN_COMMON_MALLOC_TUNING_H_

namespace pstrain {

// glibc hands multi-megabyte blocks back to the kernel on free (munmap or
// madvise) and the next allocation of the same size page-faults every page
// in again: measured at ~10% of a shard's CPU in the push/pull benchmark.
// This keeps such blocks in the heap for reuse. Call once at the start of
// main, before threads start.
void KeepBulkBuffersMapped();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MALLOC_TUNING_H_
