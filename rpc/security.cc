#include "rpc/security.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {
namespace {

constexpr char kAuthorization[] = "authorization";

absl::Mutex process_mu;
SecurityOptions& ProcessOptions() {
  static auto* options = new SecurityOptions();
  return *options;
}

// --- validation: every file read and parsed now, so a mistake is one clear
// line at start, not a handshake failure later.

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is empty"));
  auto pem = ReadFile(path);
  if (!pem.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", pem.status().message()));
  if (pem->size() > (1 << 20)) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is over 1 MiB"));
  return pem;
}

using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

BioPtr MemoryBio(const std::string& s) {
  return BioPtr(BIO_new_mem_buf(s.data(), static_cast<int>(s.size())), &BIO_free);
}

absl::StatusOr<X509Ptr> ReadCertificate(const std::string& path, const char* flag) {
  auto pem = ReadPem(path, flag);
  if (!pem.ok()) return pem.status();
  BioPtr bio = MemoryBio(*pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM certificate"));
  }
  return cert;
}

absl::Status CheckKeyPair(const SecurityOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: set both or neither");
  }
  if (o.tls_cert.empty()) return absl::OkStatus();
  auto cert = ReadCertificate(o.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto pem = ReadPem(o.tls_key, "--tls_key");
  if (!pem.ok()) return pem.status();
  BioPtr bio = MemoryBio(*pem);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key: ", o.tls_key, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key: ", o.tls_key, " is not the key of the certificate in ", o.tls_cert));
  }
  return absl::OkStatus();
}

// --- the client's token: per-call credentials from a file.

class TokenFilePlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenFilePlugin(std::string path) : path_(std::move(path)) {}

  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "pstrain-token-file"; }

  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<std::string, std::string>* metadata) override {
    absl::StatusOr<std::string> token = Current();
    if (!token.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("cannot read the token file (--token_file): ", token.status().message()));
    }
    metadata->emplace(kAuthorization, absl::StrCat("Bearer ", *token));
    return grpc::Status::OK;
  }

 private:
  // The file's token, re-read when it changed (checked at most once a second).
  absl::StatusOr<std::string> Current() {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (token_.ok() && !token_->empty() && now - checked_ < absl::Seconds(1)) return token_;
    checked_ = now;
    auto contents = ReadFile(path_);
    if (!contents.ok()) return contents.status();
    const std::string token(absl::StripAsciiWhitespace(*contents));
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(path_, " is empty"));
    if (token.size() > 4096 || token.find_first_of("\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path_, " does not hold one token on one line"));
    }
    token_ = token;
    return token_;
  }

  const std::string path_;
  absl::Mutex mu_;
  absl::StatusOr<std::string> token_ ABSL_GUARDED_BY(mu_) = std::string();
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// --- the server's check: one place, before any handler.

std::string RolesNeeded(const AccessRule& rule) {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += " or ";
    out += name;
  };
  add(rule.shard, "shard");
  add(rule.worker, "worker");
  add(rule.coordinator, "coordinator");
  add(rule.user, "user");
  add(rule.admin, "admin");
  return out;
}

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::shared_ptr<TokenTable> tokens) : tokens_(std::move(tokens)) {}

  // Digests and a stat at most once a second: cheap enough to run inline.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    auto path_it = metadata.find(":path");
    const absl::string_view method =
        path_it == metadata.end() ? absl::string_view()
                                  : absl::string_view(path_it->second.data(), path_it->second.size());
    const AccessRule rule = AccessRuleFor(method);
    if (rule.open) return grpc::Status::OK;
    auto auth_it = metadata.find(kAuthorization);
    if (auth_it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this server needs a bearer token: give the client --token_file (or "
                          "PSTRAIN_TOKEN_FILE) naming a file with a token the server accepts");
    }
    const absl::string_view token =
        BearerToken(absl::string_view(auth_it->second.data(), auth_it->second.size()));
    if (token.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the authorization metadata is not \"Bearer <token>\"");
    }
    std::optional<Caller> caller = tokens_->Find(token);
    if (!caller.has_value()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the token is not one this server accepts (its --token_auth_file)");
    }
    if (!rule.Allows(caller->role)) {
      const std::string service(method.substr(0, method.rfind('/')));
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("a ", CallerRoleName(caller->role), " token may not call ", Quote(service, 64),
                                       rule.shard || rule.worker || rule.coordinator || rule.user || rule.admin
                                           ? absl::StrCat(": it takes a ", RolesNeeded(rule), " token")
                                           : std::string(": no token may")));
    }
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokenTable> tokens_;
};

}  // namespace

bool AccessRule::Allows(CallerRole role) const {
  switch (role) {
    case CallerRole::kCluster: return shard || worker || coordinator;
    case CallerRole::kShard: return shard;
    case CallerRole::kWorker: return worker;
    case CallerRole::kCoordinator: return coordinator;
    case CallerRole::kUser: return user;
    case CallerRole::kAdmin: return admin;
    case CallerRole::kNone: break;
  }
  return false;
}

AccessRule AccessRuleFor(absl::string_view method) {
  AccessRule rule;
  if (absl::StartsWith(method, "/grpc.health.v1.Health/")) {
    rule.open = true;
  } else if (absl::StartsWith(method, "/grpc.reflection.")) {
    rule.shard = rule.worker = rule.coordinator = rule.user = rule.admin = true;  // the schema: any valid token
  } else if (absl::StartsWith(method, "/pstrain.JobService/")) {
    rule.user = rule.admin = true;
  } else if (absl::StartsWith(method, "/pstrain.ClusterService/")) {
    rule.shard = rule.worker = true;
  } else if (method == "/pstrain.ParameterService/Replicate" ||
             method == "/pstrain.EmbeddingService/ReplicateEmbeddings") {
    rule.shard = true;  // a primary shard's forward: no worker may write a backup
  } else if (absl::StartsWith(method, "/pstrain.ParameterService/") ||
             absl::StartsWith(method, "/pstrain.EmbeddingService/")) {
    rule.worker = rule.coordinator = true;
  }
  return rule;
}

std::string DescribeSecurity(const SecurityOptions& o, const ServerSecurity& security) {
  if (!o.server_tls()) return "plaintext, no tokens";
  return absl::StrCat(o.tls_client_auth == ClientAuth::kRequire ? "mutual TLS" : "TLS", ", ",
                      security.tokens == nullptr ? std::string("no tokens")
                                                 : absl::StrCat(security.tokens->size(), " tokens"));
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status ValidateSecurity(const SecurityOptions& o, bool server) {
  if (o.tls_refresh_s < 1) return absl::InvalidArgumentError("--tls_refresh_s must be >= 1");
  absl::Status pair = CheckKeyPair(o);
  if (!pair.ok()) return pair;
  if (!o.tls_ca.empty()) {
    auto ca = ReadCertificate(o.tls_ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
  }
  if (server && o.tls_client_auth == ClientAuth::kRequire && (o.tls_ca.empty() || o.tls_cert.empty())) {
    return absl::InvalidArgumentError(
        "--tls_client_auth=require needs --tls_cert, --tls_key and --tls_ca (the CA clients' certificates chain to)");
  }
  if (!o.token_file.empty() && !o.client_tls()) {
    return absl::InvalidArgumentError(
        "--token_file needs TLS (--tls_ca): gRPC sends a token only over an encrypted channel");
  }
  if (!o.token_file.empty()) {
    auto token = ReadFile(o.token_file);
    if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("--token_file: ", token.status().message()));
  }
  if (server && !o.token_auth_file.empty()) {
    if (!o.server_tls()) {
      return absl::InvalidArgumentError(
          "--token_auth_file needs TLS (--tls_cert, --tls_key): a token sent in clear is a token given away");
    }
    auto table = TokenTable::Load(o.token_auth_file);
    if (!table.ok()) return absl::InvalidArgumentError(absl::StrCat("--token_auth_file: ", table.status().message()));
  }
  return absl::OkStatus();
}

void SetProcessSecurity(const SecurityOptions& options) {
  absl::MutexLock lock(&process_mu);
  ProcessOptions() = options;
}

SecurityOptions ProcessSecurity() {
  absl::MutexLock lock(&process_mu);
  return ProcessOptions();
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const SecurityOptions& o) {
  if (!o.client_tls()) return grpc::InsecureChannelCredentials();
  const bool identity = !o.tls_cert.empty() && !o.tls_key.empty();
  const auto refresh = static_cast<unsigned int>(o.tls_refresh_s);
  auto provider =
      identity ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(o.tls_key, o.tls_cert,
                                                                                       o.tls_ca, refresh)
               : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(o.tls_ca, refresh);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (identity) tls.watch_identity_key_cert_pairs();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::experimental::TlsCredentials(tls);
  if (!o.token_file.empty()) {
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenFilePlugin>(o.token_file)));
  }
  return credentials;
}

absl::StatusOr<ServerSecurity> ServerSecurityFor(const SecurityOptions& o) {
  absl::Status valid = ValidateSecurity(o, /*server=*/true);
  if (!valid.ok()) return valid;
  ServerSecurity out;
  if (!o.server_tls()) {
    out.credentials = grpc::InsecureServerCredentials();
    return out;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.tls_key, o.tls_cert, o.tls_ca, static_cast<unsigned int>(o.tls_refresh_s));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!o.tls_ca.empty()) tls.watch_root_certs();
  tls.set_cert_request_type(o.tls_client_auth == ClientAuth::kRequire
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  out.credentials = grpc::experimental::TlsServerCredentials(tls);
  if (!o.token_auth_file.empty()) {
    auto table = TokenTable::Load(o.token_auth_file);
    if (!table.ok()) return table.status();
    out.tokens = std::move(*table);
    out.credentials->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(out.tokens));
  }
  return out;
}

Caller CallerOf(const grpc::ServerContextBase& context, TokenTable* tokens) {
  if (tokens == nullptr) return Caller{};
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorization);
  if (it == metadata.end()) return Caller{CallerRole::kNone, ""};
  std::optional<Caller> caller = tokens->Find(BearerToken(absl::string_view(it->second.data(), it->second.size())));
  return caller.value_or(Caller{CallerRole::kNone, ""});
}

}  // namespace pstrain
