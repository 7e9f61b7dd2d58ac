#include "rpc/token_table.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "common/file_util.h"

namespace pstrain {
namespace {

constexpr char kCluster[] = "cluster-token-0123456789abcdef";
constexpr char kAlice[] = "alice-token-0123456789abcdef";
constexpr char kRoot[] = "root-token-0123456789abcdef";

std::string TableText() {
  return std::string("# pstrain tokens\n\n") + kCluster + ",pstrain-cluster,1,\"pstrain:cluster\"\n" + kAlice +
         ",alice,2\n" + kRoot + ",root,3,\"ops,pstrain:admin\"\n";
}

TEST(TokenTableTest, ParsesKubernetesStaticTokenFormatIntoRoles) {
  auto rows = TokenTable::Parse(TableText(), "tokens.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].caller.role, CallerRole::kCluster);
  EXPECT_EQ((*rows)[1].caller.role, CallerRole::kUser);
  EXPECT_EQ((*rows)[1].caller.user, "alice");
  EXPECT_EQ((*rows)[2].caller.role, CallerRole::kAdmin);
}

TEST(TokenTableTest, EachMemberTokenHasOneRole) {
  auto rows = TokenTable::Parse(
      "shard-token-0123456789abcdef,ps,1,\"pstrain:shard\"\n"
      "worker-token-0123456789abcdef,pool,2,\"pstrain:worker\"\n"
      "coord-token-0123456789abcdef,coordinator,3,\"pstrain:coordinator\"\n",
      "tokens.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].caller.role, CallerRole::kShard);
  EXPECT_EQ((*rows)[1].caller.role, CallerRole::kWorker);
  EXPECT_EQ((*rows)[2].caller.role, CallerRole::kCoordinator);
  // Two member roles in one row would be a master key again.
  auto both = TokenTable::Parse("both-token-0123456789abcdef,x,1,\"pstrain:shard,pstrain:worker\"\n", "tokens.csv");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("one member role"), std::string::npos) << both.status();
  EXPECT_EQ(both.status().message().find("both-token"), std::string::npos) << both.status();
}

TEST(TokenTableTest, RefusesBadFilesWithoutQuotingTokens) {
  const std::string secret = "short-secret";
  for (const std::string& text :
       {secret + ",bob,1\n", std::string(kAlice) + ",bob\n", std::string(kAlice) + ",b o b,1\n",
        std::string(kAlice) + ",a,1\n" + kAlice + ",b,2\n", std::string(kAlice) + ",a,1,\"x\n", std::string("# none\n")}) {
    auto rows = TokenTable::Parse(text, "tokens.csv");
    ASSERT_FALSE(rows.ok()) << text;
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(rows.status().message().find("tokens.csv"), std::string::npos) << rows.status();
    EXPECT_EQ(rows.status().message().find(secret), std::string::npos) << rows.status();
    EXPECT_EQ(rows.status().message().find(kAlice), std::string::npos) << rows.status();
  }
}

TEST(TokenTableTest, FindsByTokenAndReloadsWhenTheFileChanges) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/tokens.csv";
  ASSERT_TRUE(WriteFileAtomically(path, TableText()).ok());
  auto table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->Find(kAlice)->user, "alice");
  EXPECT_EQ((*table)->Find(kCluster)->role, CallerRole::kCluster);
  EXPECT_FALSE((*table)->Find("").has_value());
  EXPECT_FALSE((*table)->Find(std::string(kAlice) + "x").has_value());
  EXPECT_FALSE((*table)->Find(std::string(kAlice).substr(1)).has_value());

  // Rotation: alice's token replaced; the old one stops working.
  const std::string rotated = "alice-rotated-0123456789abcdef";
  ASSERT_TRUE(WriteFileAtomically(path, rotated + ",alice,2\n").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE((*table)->Find(kAlice).has_value());
  EXPECT_EQ((*table)->Find(rotated)->user, "alice");

  // A broken file keeps the previous table.
  ASSERT_TRUE(WriteFileAtomically(path, "garbage\n").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ((*table)->Find(rotated)->user, "alice");
}

TEST(TokenTableTest, BearerTokenParsesTheHeader) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
}

}  // namespace
}  // namespace pstrain
