#include "common/env_flags.h"

#include <gtest/gtest.h>

#include "absl/flags/flag.h"

ABSL_FLAG(int, env_test_port, 7000, "a test flag");
ABSL_FLAG(std::string, env_test_host, "0.0.0.0", "a test flag");
ABSL_FLAG(bool, env_test_verbose, false, "a test flag");

namespace pstrain {
namespace {

TEST(EnvFlags, VariableNames) {
  EXPECT_EQ(EnvNameForFlag("metrics_port"), "PSTRAIN_METRICS_PORT");
  EXPECT_EQ(EnvNameForFlag("coordinator"), "PSTRAIN_COORDINATOR");
}

TEST(EnvFlags, EnvironmentSetsFlagsAndBadValuesAreRefused) {
  ASSERT_TRUE(ApplyEnvironmentToFlags({"PSTRAIN_ENV_TEST_PORT=7443", "PSTRAIN_ENV_TEST_HOST=pstrain-coordinator",
                                       "PSTRAIN_ENV_TEST_VERBOSE=true", "PSTRAIN_NOT_A_FLAG=1", "HOME=/root",
                                       "ENV_TEST_PORT=1"})
                  .ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_port), 7443);
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_host), "pstrain-coordinator");
  EXPECT_TRUE(absl::GetFlag(FLAGS_env_test_verbose));
  absl::Status s = ApplyEnvironmentToFlags({"PSTRAIN_ENV_TEST_PORT=seven"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("PSTRAIN_ENV_TEST_PORT"), absl::string_view::npos) << s;
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_port), 7443);  // unchanged
}

TEST(EnvFlags, StatefulSetOrdinalFromHostname) {
  EXPECT_EQ(OrdinalFromHostname("pstrain-worker-0"), 0);
  EXPECT_EQ(OrdinalFromHostname("pstrain-worker-3"), 3);
  EXPECT_EQ(OrdinalFromHostname("pstrain-ps-12"), 12);
  EXPECT_EQ(OrdinalFromHostname("pstrain-ps-12.pstrain-ps.ns.svc.cluster.local"), -1);
  EXPECT_EQ(OrdinalFromHostname("laptop"), -1);
  EXPECT_EQ(OrdinalFromHostname("pstrain-coordinator-7d9f8c6b5-x2k4q"), -1);
  EXPECT_EQ(OrdinalFromHostname("worker-"), -1);
  EXPECT_EQ(OrdinalFromHostname("-3"), -1);
  EXPECT_EQ(OrdinalFromHostname("node-01"), -1);
  EXPECT_EQ(OrdinalFromHostname("x-99999999999"), -1);
}

}  // namespace
}  // namespace pstrain
