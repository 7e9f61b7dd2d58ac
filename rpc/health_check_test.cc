#include "rpc/health_check.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_server.h"

namespace pstrain {
namespace {

TEST(HealthCheck, ServingThenNotServingThenUnreachable) {
  GrpcServerOptions o;
  o.address = "127.0.0.1:0";
  auto server = GrpcServer::Create(o, {});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = absl::StrCat("127.0.0.1:", (*server)->port());
  auto s = CheckHealth(target, "", absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "SERVING");
  auto unknown = CheckHealth(target, "no.such.Service", absl::Seconds(10));
  EXPECT_FALSE(unknown.ok());  // the default service answers NOT_FOUND
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  (*server)->Shutdown(absl::Seconds(1));
  auto gone = CheckHealth(target, "", absl::Seconds(2));
  EXPECT_FALSE(gone.ok());
  EXPECT_TRUE(absl::IsUnavailable(gone.status()) || absl::IsDeadlineExceeded(gone.status())) << gone.status();
}

}  // namespace
}  // namespace pstrain
