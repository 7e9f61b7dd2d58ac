// Transport security and authentication for every pstrain gRPC server and
// channel, from one SecurityOptions (flags and PSTRAIN_* variables: see
// rpc/security_flags.h).
//
// - TLS with gRPC's own credentials. Certificates and keys are watched
//   (FileWatcherCertificateProvider): a rotated file is used by new
//   connections within tls_refresh_s, without a restart. Mutual TLS with
//   tls_client_auth = kRequire.
// - Bearer tokens: a client sends `authorization: Bearer <token>` on every
//   call (per-call credentials read from token_file, re-read when it
//   changes); a server checks it in one place, an AuthMetadataProcessor,
//   against its TokenTable, by the role the method's service needs
//   (AccessPolicy) before any handler runs. No token: UNAUTHENTICATED; a
//   token of the wrong role: PERMISSION_DENIED. The health service needs
//   none (probes).
// - Tokens need TLS: gRPC sends call credentials only over an encrypted
//   channel, and a token in clear is a token given away.
//
// Plaintext, no tokens (the defaults) is for 127.0.0.1: a server bound to
// another address without TLS logs a warning naming the flags.
#ifndef PSTRAIN_RPC_SECURITY_H_
#define PSTRAIN_RPC_SECURITY_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/caller.h"
#include "rpc/token_table.h"

namespace pstrain {

enum class ClientAuth { kNone, kRequire };

struct SecurityOptions {
  // This process's certificate chain and key (PEM): a server's identity, and
  // a client's under mutual TLS.
  std::string tls_cert;
  std::string tls_key;
  // CA bundle (PEM) that peers' certificates must chain to. Setting it turns
  // TLS on for this process's channels.
  std::string tls_ca;
  ClientAuth tls_client_auth = ClientAuth::kNone;
  // Name this process's channels expect in servers' certificates, instead of
  // the host of the target (pods reached by IP, one certificate for a pool).
  std::string tls_server_name;
  int tls_refresh_s = 60;
  // The bearer token this process's channels send (a file: the Secret).
  std::string token_file;
  // The tokens this process's servers accept (TokenTable's format); empty:
  // no authentication.
  std::string token_auth_file;

  bool server_tls() const { return !tls_cert.empty(); }
  bool client_tls() const { return !tls_ca.empty(); }
};

// Checks that the combination makes sense and the files are readable; the
// message names the flag to fix. `server`: this process serves gRPC.
absl::Status ValidateSecurity(const SecurityOptions& options, bool server);

// The options this process's servers and channels use unless told
// otherwise; set once at start (InstallSecurityFromFlags), read anywhere.
void SetProcessSecurity(const SecurityOptions& options);
SecurityOptions ProcessSecurity();

// Channel credentials: TLS (+ the token) or plaintext.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const SecurityOptions& options);

// The roles a full method name ("/pstrain.JobService/SubmitJob") takes:
// health is open; reflection takes any valid token; JobService users and
// admins; ClusterService shards and workers; ParameterService and
// EmbeddingService workers and the coordinator (which of their methods the
// coordinator alone may call, the services themselves check); the
// any-member cluster token both. Anything else is refused.
struct AccessRule {
  bool open = false;
  bool shard = false;
  bool worker = false;
  bool coordinator = false;
  bool user = false;
  bool admin = false;
  bool Allows(CallerRole role) const;
};
AccessRule AccessRuleFor(absl::string_view method);

// Server credentials (TLS with the token check, or plaintext) and the
// table the handlers resolve callers against (null without tokens).
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<TokenTable> tokens;
};
absl::StatusOr<ServerSecurity> ServerSecurityFor(const SecurityOptions& options);

// The caller of a call that passed the server's check: by its token, or an
// anonymous admin when `tokens` is null (authentication off).
Caller CallerOf(const grpc::ServerContextBase& context, TokenTable* tokens);

// "TLS, mutual TLS, N tokens" or "plaintext, no tokens": for a server's
// start-up line.
std::string DescribeSecurity(const SecurityOptions& options, const ServerSecurity& security);

// True for 127.0.0.1, ::1, localhost (a server bound there is out of reach
// of other machines).
bool IsLoopbackHost(absl::string_view host);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_SECURITY_H_
