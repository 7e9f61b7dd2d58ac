#include "worker/launch_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace pstrain {
namespace {

// Reads `name` into *out when set: an integer in [lo, hi].
absl::Status ReadInt(const std::function<const char*(const char*)>& getenv, const char* name, int lo, int hi,
                     int* out) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return absl::OkStatus();
  int n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < lo || n > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", Quote(v, 32), ": expected an integer from ", lo, " to ", hi));
  }
  *out = n;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchEnv> ReadLaunchEnv(const std::function<const char*(const char*)>& getenv) {
  LaunchEnv env;
  constexpr int kMaxRanks = 1 << 20;
  absl::Status s = ReadInt(getenv, "RANK", 0, kMaxRanks - 1, &env.rank);
  if (s.ok()) s = ReadInt(getenv, "WORLD_SIZE", 1, kMaxRanks, &env.world_size);
  if (s.ok()) s = ReadInt(getenv, "LOCAL_RANK", 0, kMaxRanks - 1, &env.local_rank);
  if (s.ok()) s = ReadInt(getenv, "MASTER_PORT", 1, 65535, &env.master_port);
  if (!s.ok()) return s;
  if (env.rank >= 0 && env.world_size > 0 && env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", env.rank, " is not below WORLD_SIZE=", env.world_size));
  }
  if (const char* v = getenv("MASTER_ADDR")) env.master_addr = v;
  if (const char* v = getenv("GLOO_SOCKET_IFNAME")) env.gloo_interface = v;
  return env;
}

}  // namespace pstrain
