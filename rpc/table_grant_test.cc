#include "rpc/table_grant.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/file_util.h"

namespace pstrain {
namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";

TEST(TableGrantTest, BindsJobAttemptAndSecretToTheKey) {
  const std::string grant = TableGrant(kKey, "job-000001", 3, "s3cret");
  EXPECT_EQ(grant.size(), 64u);
  EXPECT_TRUE(TableGrantValid(kKey, "job-000001", 3, "s3cret", grant));
  // Any other job, attempt, secret or key: not valid.
  EXPECT_FALSE(TableGrantValid(kKey, "job-000002", 3, "s3cret", grant));
  EXPECT_FALSE(TableGrantValid(kKey, "job-000001", 4, "s3cret", grant));
  EXPECT_FALSE(TableGrantValid(kKey, "job-000001", 3, "other", grant));
  EXPECT_FALSE(TableGrantValid("another-key-0123456789abcdef0123", "job-000001", 3, "s3cret", grant));
  // The fields are separated: "job-1" + "1" is not "job-11" + "".
  EXPECT_NE(TableGrant(kKey, "job-1", 1, "1"), TableGrant(kKey, "job-11", 1, ""));
  EXPECT_FALSE(TableGrantValid(kKey, "job-000001", 3, "s3cret", ""));
  EXPECT_FALSE(TableGrantValid(kKey, "job-000001", 3, "s3cret", grant.substr(0, 63)));
}

TEST(TableGrantTest, KeysAreReadFromRegularFilesAndMustBeLong) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR"));
  ASSERT_TRUE(WriteFileAtomically(dir + "/good.key", std::string(kKey) + "\n").ok());
  auto key = LoadTableGrantKey(dir + "/good.key", "--table_grant_key_file");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, kKey);
  ASSERT_TRUE(WriteFileAtomically(dir + "/short.key", "too-short\n").ok());
  auto short_key = LoadTableGrantKey(dir + "/short.key", "--table_grant_key_file");
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("--table_grant_key_file"), std::string::npos);
  EXPECT_EQ(short_key.status().message().find("too-short"), std::string::npos) << "the key is never quoted";
  EXPECT_FALSE(LoadTableGrantKey(dir + "/missing.key", "--table_grant_key_file").ok());
  EXPECT_FALSE(LoadTableGrantKey("/dev/zero", "--table_grant_key_file").ok());
}

}  // namespace
}  // namespace pstrain
