#include "rpc/security_flags.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "", "This process's TLS certificate chain (PEM): its servers' identity, and its "
                                     "channels' under mutual TLS. Re-read when the file changes.");
ABSL_FLAG(std::string, tls_key, "", "The private key of --tls_cert (PEM, unencrypted).");
ABSL_FLAG(std::string, tls_ca, "", "CA bundle (PEM) that peers' certificates must chain to; turns TLS on for "
                                   "this process's channels.");
ABSL_FLAG(std::string, tls_client_auth, "none",
          "none|require: whether this process's servers require a client certificate (mutual TLS).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name this process's channels expect in servers' certificates instead of the target's host.");
ABSL_FLAG(int, tls_refresh_s, 60, "How often certificate and key files are checked for a rotation, in seconds.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token this process sends on every call (needs --tls_ca).");
ABSL_FLAG(std::string, token_auth_file, "",
          "The tokens this process's servers accept, in Kubernetes' static token file format "
          "(token,user,uid,\"groups\"; groups pstrain:cluster and pstrain:admin). Needs --tls_cert.");

namespace pstrain {

SecurityOptions InstallSecurityFromFlags(const char* binary, bool server) {
  SecurityOptions o;
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.tls_refresh_s = absl::GetFlag(FLAGS_tls_refresh_s);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.token_auth_file = absl::GetFlag(FLAGS_token_auth_file);
  const std::string client_auth = absl::GetFlag(FLAGS_tls_client_auth);
  absl::Status valid = absl::OkStatus();
  if (client_auth == "require") {
    o.tls_client_auth = ClientAuth::kRequire;
  } else if (client_auth != "none") {
    valid = absl::InvalidArgumentError("--tls_client_auth must be none or require");
  }
  if (valid.ok()) valid = ValidateSecurity(o, server);
  if (!valid.ok()) {
    std::fprintf(stderr, "%s: %s\n", binary, std::string(valid.message()).c_str());
    std::exit(2);
  }
  SetProcessSecurity(o);
  return o;
}

}  // namespace pstrain
