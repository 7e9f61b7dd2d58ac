#include "rpc/table_grant.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace pstrain {

absl::StatusOr<std::string> LoadTableGrantKey(const std::string& path, const char* flag) {
  absl::StatusOr<std::string> contents = ReadRegularFile(path, 4096);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        absl::StrCat(flag, ": cannot read the table grant key: ", contents.status().message()));
  }
  std::string key(absl::StripTrailingAsciiWhitespace(*contents));
  if (key.size() < kMinTableGrantKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": the table grant key in ", path, " is shorter than ",
                                                   kMinTableGrantKeyBytes, " bytes (make one with `openssl rand "
                                                   "-hex 32`)"));
  }
  return key;
}

std::string TableGrant(absl::string_view key, absl::string_view job, uint64_t attempt, absl::string_view secret) {
  const std::string message = absl::StrCat("pstrain-table-grant-v1\n", job, "\n", attempt, "\n", secret);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), mac, &mac_len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), mac_len));
}

bool TableGrantValid(absl::string_view key, absl::string_view job, uint64_t attempt, absl::string_view secret,
                     absl::string_view presented) {
  const std::string want = TableGrant(key, job, attempt, secret);
  return presented.size() == want.size() && CRYPTO_memcmp(presented.data(), want.data(), want.size()) == 0;
}

}  // namespace pstrain
