#include "common/quote.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pstrain {

std::string Quote(absl::string_view s, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    }
  }
  if (s.size() > max_bytes) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

}  // namespace pstrain
