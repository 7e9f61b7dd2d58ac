// Helpers of the coordinator's tests.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_TESTING_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_TESTING_H_

#include <gtest/gtest.h>

#include <string>

#include "server/coordinator/coordinator.h"

namespace pstrain {

// Submits `spec` (output under the test's temporary directory); its id.
inline std::string SubmitSpec(Coordinator& c, const std::string& spec) {
  SubmitJobRequest req;
  req.set_spec_yaml(spec);
  req.set_output_dir(::testing::TempDir() + "/out");
  auto id = c.SubmitJob(req);
  EXPECT_TRUE(id.ok()) << id.status();
  return id.value_or("");
}

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_TESTING_H_
