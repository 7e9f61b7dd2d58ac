#include "rpc/table_grant.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace pstrain {
namespace {

constexpr size_t kSignatureBytes = 64;  // Ed25519

std::string Message(absl::string_view job, uint64_t attempt, absl::string_view secret) {
  return absl::StrCat("pstrain-table-grant-v1\n", job, "\n", attempt, "\n", secret);
}

// The key in `path` read by `read` (PEM), checked to be Ed25519.
template <typename Read>
absl::StatusOr<EVP_PKEY*> ReadKey(const std::string& path, const char* flag, const char* what, Read read) {
  absl::StatusOr<std::string> pem = ReadRegularFile(path, 64 << 10);
  if (!pem.ok()) {
    return absl::Status(pem.status().code(),
                        absl::StrCat(flag, ": cannot read the table grant ", what, ": ", pem.status().message()));
  }
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  EVP_PKEY* key = bio == nullptr ? nullptr : read(bio);
  BIO_free(bio);
  if (key == nullptr || EVP_PKEY_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no Ed25519 ", what,
                                                   " in PEM (make one with `openssl genpkey -algorithm ed25519` or "
                                                   "`pstrain credentials`)"));
  }
  return key;
}

std::string ToPem(EVP_PKEY* key, bool private_key) {
  if (key == nullptr) return "";  // keygen failed: the caller says so
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return "";
  const int ok = private_key ? PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr)
                             : PEM_write_bio_PUBKEY(bio, key);
  std::string out;
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (ok == 1 && n > 0) out.assign(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TableGrantSigner>> TableGrantSigner::Load(const std::string& path,
                                                                               const char* flag) {
  auto key = ReadKey(path, flag, "private key",
                     [](BIO* b) { return PEM_read_bio_PrivateKey(b, nullptr, nullptr, nullptr); });
  if (!key.ok()) return key.status();
  return std::shared_ptr<const TableGrantSigner>(new TableGrantSigner(*key));
}

std::shared_ptr<const TableGrantSigner> TableGrantSigner::Generate() {
  return std::shared_ptr<const TableGrantSigner>(new TableGrantSigner(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519")));
}

TableGrantSigner::~TableGrantSigner() { EVP_PKEY_free(key_); }

std::string TableGrantSigner::Sign(absl::string_view job, uint64_t attempt, absl::string_view secret) const {
  if (key_ == nullptr) return "";
  const std::string message = Message(job, attempt, secret);
  unsigned char sig[kSignatureBytes];
  size_t sig_len = sizeof(sig);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx != nullptr && EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key_) == 1 &&
                  EVP_DigestSign(ctx, sig, &sig_len, reinterpret_cast<const unsigned char*>(message.data()),
                                 message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  if (!ok) return "";  // no grant: the shards refuse the table, saying so
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(sig), sig_len));
}

std::string TableGrantSigner::PublicKeyPem() const { return ToPem(key_, false); }
std::string TableGrantSigner::PrivateKeyPem() const { return ToPem(key_, true); }

absl::StatusOr<std::shared_ptr<const TableGrantVerifier>> TableGrantVerifier::Load(const std::string& path,
                                                                                   const char* flag) {
  auto key =
      ReadKey(path, flag, "public key", [](BIO* b) { return PEM_read_bio_PUBKEY(b, nullptr, nullptr, nullptr); });
  if (!key.ok()) return key.status();
  return std::shared_ptr<const TableGrantVerifier>(new TableGrantVerifier(*key));
}

absl::StatusOr<std::shared_ptr<const TableGrantVerifier>> TableGrantVerifier::FromPem(const std::string& pem,
                                                                                      const std::string& source) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  EVP_PKEY* key = bio == nullptr ? nullptr : PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (key == nullptr || EVP_PKEY_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    return absl::InvalidArgumentError(absl::StrCat(source, ": no Ed25519 public key in PEM"));
  }
  return std::shared_ptr<const TableGrantVerifier>(new TableGrantVerifier(key));
}

TableGrantVerifier::~TableGrantVerifier() { EVP_PKEY_free(key_); }

bool TableGrantVerifier::Valid(absl::string_view job, uint64_t attempt, absl::string_view secret,
                               absl::string_view presented) const {
  if (presented.size() != 2 * kSignatureBytes) return false;
  for (char c : presented) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  const std::string sig = absl::HexStringToBytes(presented);
  const std::string message = Message(job, attempt, secret);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, key_) == 1 &&
                  EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                                   reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

}  // namespace pstrain
