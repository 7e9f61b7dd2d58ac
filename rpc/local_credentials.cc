#include "rpc/local_credentials.h"

#include "rpc/table_grant.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/random_hex.h"

namespace pstrain {
namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

absl::Status OpenSslError(const char* what) {
  return absl::InternalError(absl::StrCat("OpenSSL could not ", what));
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError("make a certificate extension");
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return added == 1 ? absl::OkStatus() : OpenSslError("add a certificate extension");
}

// A certificate for `key`, signed by issuer_key (itself when issuer is null).
absl::StatusOr<X509Ptr> MakeCertificate(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                                        EVP_PKEY* issuer_key, const LocalCredentialsOptions& o) {
  X509Ptr cert(X509_new(), &X509_free);
  if (cert == nullptr) return OpenSslError("allocate a certificate");
  X509_set_version(cert.get(), 2);
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), &BN_free);
  if (!BN_rand(serial.get(), 128, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    return OpenSslError("make a serial number");
  }
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(o.valid_days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  X509* signer = issuer == nullptr ? cert.get() : issuer;
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  const bool ca = issuer == nullptr;
  std::vector<std::pair<int, std::string>> extensions = {
      {NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE"},
      {NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature,keyEncipherment"},
      {NID_subject_key_identifier, "hash"},
  };
  if (!ca) {
    extensions.push_back({NID_authority_key_identifier, "keyid:always"});
    extensions.push_back({NID_ext_key_usage, "serverAuth,clientAuth"});
    extensions.push_back({NID_subject_alt_name, absl::StrJoin(o.alt_names, ",")});
  }
  for (const auto& [nid, value] : extensions) {
    absl::Status s = AddExtension(cert.get(), signer, nid, value);
    if (!s.ok()) return s;
  }
  if (X509_sign(cert.get(), ca ? key : issuer_key, EVP_sha256()) == 0) return OpenSslError("sign a certificate");
  return cert;
}

template <typename Write>
absl::StatusOr<std::string> Pem(Write write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (bio == nullptr || write(bio.get()) != 1) return OpenSslError("write PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::Status WritePrivate(const std::string& path, const std::string& contents, mode_t mode) {
  absl::Status s = WriteFileAtomically(path, contents);
  if (s.ok() && chmod(path.c_str(), mode) != 0) return ErrnoToStatus(errno, "cannot chmod", path);
  return s;
}

}  // namespace

absl::StatusOr<std::string> RandomToken() { return RandomHex(32); }

absl::StatusOr<LocalCredentials> WriteLocalCredentials(const std::string& dir, const LocalCredentialsOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "cannot create", dir);
  if (chmod(dir.c_str(), 0700) != 0) return ErrnoToStatus(errno, "cannot chmod", dir);
  KeyPtr ca_key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  KeyPtr member_key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  if (ca_key == nullptr || member_key == nullptr) return OpenSslError("make an EC key");
  auto ca = MakeCertificate(ca_key.get(), o.common_name + " CA", nullptr, nullptr, o);
  if (!ca.ok()) return ca.status();
  auto member = MakeCertificate(member_key.get(), o.common_name, ca->get(), ca_key.get(), o);
  if (!member.ok()) return member.status();

  LocalCredentials out{dir + "/ca.pem",       dir + "/member.pem",       dir + "/member-key.pem",
                       dir + "/tokens.csv",   dir + "/cluster.token",    dir + "/user.token",
                       dir + "/admin.token",  dir + "/shard.token",      dir + "/worker.token",
                       dir + "/coordinator.token", dir + "/table-grant.key", dir + "/table-grant.pub"};
  auto ca_pem = Pem([&](BIO* b) { return PEM_write_bio_X509(b, ca->get()); });
  auto cert_pem = Pem([&](BIO* b) { return PEM_write_bio_X509(b, member->get()); });
  auto key_pem = Pem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, member_key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  auto cluster = RandomToken();
  auto user = RandomToken();
  auto admin = RandomToken();
  auto shard = RandomToken();
  auto worker = RandomToken();
  auto coordinator = RandomToken();
  const std::shared_ptr<const TableGrantSigner> grants = TableGrantSigner::Generate();
  const std::string grant_key = grants->PrivateKeyPem(), grant_public = grants->PublicKeyPem();
  if (grant_key.empty() || grant_public.empty()) return OpenSslError("make the table grant key");
  for (const auto* s : {&ca_pem, &cert_pem, &key_pem, &cluster, &user, &admin, &shard, &worker, &coordinator}) {
    if (!s->ok()) return s->status();
  }
  const std::string table = absl::StrCat("# token,user,uid,groups (Kubernetes' static token file format)\n",
                                         *cluster, ",pstrain-cluster,1,\"pstrain:cluster\"\n", *user, ",", o.user,
                                         ",2\n", *admin, ",admin,3,\"pstrain:admin\"\n", *shard,
                                         ",pstrain-shard,4,\"pstrain:shard\"\n", *worker,
                                         ",pstrain-worker,5,\"pstrain:worker\"\n", *coordinator,
                                         ",pstrain-coordinator,6,\"pstrain:coordinator\"\n");
  const std::vector<std::tuple<std::string, std::string, mode_t>> files = {
      {out.ca, *ca_pem, 0644},          {out.cert, *cert_pem, 0644},       {out.key, *key_pem, 0600},
      {out.token_auth_file, table, 0600}, {out.cluster_token_file, *cluster + "\n", 0600},
      {out.user_token_file, *user + "\n", 0600}, {out.admin_token_file, *admin + "\n", 0600},
      {out.shard_token_file, *shard + "\n", 0600}, {out.worker_token_file, *worker + "\n", 0600},
      {out.coordinator_token_file, *coordinator + "\n", 0600}, {out.table_grant_key_file, grant_key, 0600},
      {out.table_grant_public_key_file, grant_public, 0644},
  };
  for (const auto& [path, contents, mode] : files) {
    absl::Status s = WritePrivate(path, contents, mode);
    if (!s.ok()) return s;
  }
  return out;
}

}  // namespace pstrain
