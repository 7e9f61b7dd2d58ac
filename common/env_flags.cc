#include "common/env_flags.h"

#include <unistd.h>

#include <cctype>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace pstrain {

std::string EnvNameForFlag(const std::string& flag) { return "PSTRAIN_" + absl::AsciiStrToUpper(flag); }

absl::Status ApplyEnvironmentToFlags(const std::vector<std::string>& env) {
  const auto flags = absl::GetAllFlags();
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || entry.rfind("PSTRAIN_", 0) != 0) continue;
    const std::string name = absl::AsciiStrToLower(entry.substr(8, eq - 8));
    auto it = flags.find(name);
    if (it == flags.end()) continue;  // another binary's setting, or none
    std::string error;
    if (!it->second->ParseFrom(entry.substr(eq + 1), &error)) {
      return absl::InvalidArgumentError(absl::StrCat(entry.substr(0, eq), ": ", error));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyEnvironmentToFlags() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return ApplyEnvironmentToFlags(env);
}

int OrdinalFromHostname(const std::string& hostname) {
  const size_t dash = hostname.rfind('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 >= hostname.size()) return -1;
  const std::string digits = hostname.substr(dash + 1);
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  if (digits.size() > 1 && digits[0] == '0') return -1;  // not an ordinal
  int n = -1;
  if (!absl::SimpleAtoi(digits, &n)) return -1;
  return n;
}

int HostOrdinal() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return -1;
  return OrdinalFromHostname(host);
}

}  // namespace pstrain
