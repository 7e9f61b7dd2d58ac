// Quoting strings that came from a client into messages and logs: at most a
// bounded prefix, with control and non-ASCII bytes escaped, so a hostile
// 1 MiB name or a terminal escape sequence never reaches a log line whole.
#ifndef PSTRAIN_COMMON_QUOTE_H_
#define PSTRAIN_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace pstrain {

// The first `max_bytes` bytes of `s`, printable ASCII kept, anything else as
// \xNN; "...(N bytes)" appended when cut. No surrounding quotes.
std::string Quote(absl::string_view s, size_t max_bytes = 64);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_QUOTE_H_
