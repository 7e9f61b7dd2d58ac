// CRC-32C (Castagnoli), as TensorBoard's record format uses it, and the
// record format's masking. Debian 12 ships no C++ CRC-32C library (Abseil
// gained absl/crc only in 2023), so this is the classic table-driven form;
// tensorboard/event_writer_test checks it against RFC 3720's test vectors
// and tests/read_events.py checks every record with an independent
// implementation (Debian's python3-crc32c). The event writer moves a few
// kilobytes a second: a table is fast enough.
#ifndef PSTRAIN_TENSORBOARD_CRC32C_H_
#define PSTRAIN_TENSORBOARD_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace pstrain {

uint32_t Crc32c(const void* data, size_t n);

// TensorBoard's (and TFRecord's) masked CRC: stored CRCs are rotated and
// offset so that a CRC of data holding CRCs stays well distributed.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace pstrain

#endif  // PSTRAIN_TENSORBOARD_CRC32C_H_
