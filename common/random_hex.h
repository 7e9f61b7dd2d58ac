// Unguessable identifiers: `bytes` bytes from the kernel's CSPRNG
// (getrandom(2)), hex-encoded.
#ifndef PSTRAIN_COMMON_RANDOM_HEX_H_
#define PSTRAIN_COMMON_RANDOM_HEX_H_

#include <string>

namespace pstrain {

std::string RandomHex(size_t bytes);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_RANDOM_HEX_H_
