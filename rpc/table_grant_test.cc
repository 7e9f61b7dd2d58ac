#include "rpc/table_grant.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/file_util.h"

namespace pstrain {
namespace {

TEST(TableGrantTest, BindsJobAttemptAndSecretToTheCoordinatorsKey) {
  auto signer = TableGrantSigner::Generate();
  auto verifier = TableGrantVerifier::FromPem(signer->PublicKeyPem(), "test");
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  const std::string grant = signer->Sign("job-000001", 3, "s3cret");
  EXPECT_EQ(grant.size(), 128u);
  EXPECT_TRUE((*verifier)->Valid("job-000001", 3, "s3cret", grant));
  // Any other job, attempt or secret: not valid.
  EXPECT_FALSE((*verifier)->Valid("job-000002", 3, "s3cret", grant));
  EXPECT_FALSE((*verifier)->Valid("job-000001", 4, "s3cret", grant));
  EXPECT_FALSE((*verifier)->Valid("job-000001", 3, "other", grant));
  // The fields are separated: "job-1" + "1" is not "job-11" + "".
  EXPECT_FALSE((*verifier)->Valid("job-11", 1, "", signer->Sign("job-1", 1, "1")));
  // Another key's signature, a cut one, one not hex, none.
  EXPECT_FALSE((*verifier)->Valid("job-000001", 3, "s3cret", TableGrantSigner::Generate()->Sign("job-000001", 3, "s3cret")));
  EXPECT_FALSE((*verifier)->Valid("job-000001", 3, "s3cret", grant.substr(0, 126)));
  EXPECT_FALSE((*verifier)->Valid("job-000001", 3, "s3cret", std::string(128, 'z')));
  EXPECT_FALSE((*verifier)->Valid("job-000001", 3, "s3cret", ""));
}

TEST(TableGrantTest, KeysAreEd25519PemFiles) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR"));
  auto signer = TableGrantSigner::Generate();
  ASSERT_TRUE(WriteFileAtomically(dir + "/grant.key", signer->PrivateKeyPem()).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/grant.pub", signer->PublicKeyPem()).ok());
  auto loaded = TableGrantSigner::Load(dir + "/grant.key", "--table_grant_key_file");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto verifier = TableGrantVerifier::Load(dir + "/grant.pub", "--table_grant_public_key_file");
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  EXPECT_TRUE((*verifier)->Valid("j", 1, "s", (*loaded)->Sign("j", 1, "s")));
  // The public key signs nothing; the private key is not a public key file.
  EXPECT_FALSE(TableGrantSigner::Load(dir + "/grant.pub", "--table_grant_key_file").ok());
  auto wrong = TableGrantVerifier::Load(dir + "/grant.key", "--table_grant_public_key_file");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("--table_grant_public_key_file"), std::string::npos) << wrong.status();
  EXPECT_EQ(wrong.status().message().find("PRIVATE KEY-----\nMC"), std::string::npos) << "the key is never quoted";
  ASSERT_TRUE(WriteFileAtomically(dir + "/junk.key", "not a key\n").ok());
  EXPECT_FALSE(TableGrantSigner::Load(dir + "/junk.key", "--table_grant_key_file").ok());
  EXPECT_FALSE(TableGrantSigner::Load(dir + "/missing.key", "--table_grant_key_file").ok());
  EXPECT_FALSE(TableGrantVerifier::Load("/dev/zero", "--table_grant_public_key_file").ok());
}

}  // namespace
}  // namespace pstrain
