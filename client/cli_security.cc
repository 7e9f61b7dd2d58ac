#include "client/cli_security.h"

namespace pstrain {

void AddSecurityOptions(CLI::App& app, SecurityOptions* o) {
  app.add_option("--tls_ca", o->tls_ca, "CA (PEM) the coordinator's certificate chains to; turns TLS on")
      ->envname("PSTRAIN_TLS_CA");
  app.add_option("--tls_cert", o->tls_cert, "client certificate (PEM), for servers that require one")
      ->envname("PSTRAIN_TLS_CERT");
  app.add_option("--tls_key", o->tls_key, "the client certificate's key (PEM)")->envname("PSTRAIN_TLS_KEY");
  app.add_option("--tls_server_name", o->tls_server_name, "name in the coordinator's certificate, if not its host")
      ->envname("PSTRAIN_TLS_SERVER_NAME");
  app.add_option("--token_file", o->token_file, "file holding your token (needs --tls_ca)")
      ->envname("PSTRAIN_TOKEN_FILE");
}

absl::Status InstallClientSecurity(const SecurityOptions& options) {
  absl::Status valid = ValidateSecurity(options, /*server=*/false);
  if (valid.ok()) SetProcessSecurity(options);
  return valid;
}

}  // namespace pstrain
