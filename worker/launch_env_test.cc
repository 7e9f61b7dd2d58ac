#include "worker/launch_env.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

absl::StatusOr<LaunchEnv> Read(std::map<std::string, std::string> vars) {
  return ReadLaunchEnv([vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, TorchrunVariables) {
  auto env = Read({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.2"},
                   {"MASTER_PORT", "29500"}, {"GLOO_SOCKET_IFNAME", "eth1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.2");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->gloo_interface, "eth1");
}

TEST(LaunchEnv, UnsetMeansDefaults) {
  auto env = Read({});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, -1);
  EXPECT_EQ(env->world_size, 0);
  EXPECT_EQ(env->local_rank, 0);
  EXPECT_EQ(env->master_port, 0);
}

TEST(LaunchEnv, BadNumbersNameTheVariable) {
  const std::pair<std::string, std::string> bad[] = {
      {"RANK", "two"}, {"RANK", "-1"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "1x"},
      {"MASTER_PORT", "70000"}, {"MASTER_PORT", ""}};
  for (const auto& [name, value] : bad) {
    auto env = Read({{name, value}});
    if (value.empty()) {
      EXPECT_TRUE(env.ok()) << name << " empty counts as unset";
      continue;
    }
    ASSERT_FALSE(env.ok()) << name << "=" << value;
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(env.status().message().find(name), std::string::npos) << env.status();
  }
  auto env = Read({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_FALSE(env.ok());
}

}  // namespace
}  // namespace pstrain
