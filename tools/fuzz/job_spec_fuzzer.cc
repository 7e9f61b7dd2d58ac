// libFuzzer target: the job-spec parser (common/job_spec.cc) on arbitrary
// text. Invariants: never throws (yaml-cpp throws from many places), and a
// spec it accepts keeps its own invariants. tools/fuzz/run.sh builds it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pstrain::JobSpec> spec;
  try {
    spec = pstrain::ParseJobSpec(yaml, "fuzz.yaml");
  } catch (...) {
    std::abort();  // an exception escaped the parser
  }
  if (spec.ok() && (spec->workers < 1 || spec->batch_size < 1)) std::abort();
  return 0;
}
