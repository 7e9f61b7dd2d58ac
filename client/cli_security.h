// The CLI's TLS and token options, for a secured coordinator:
//   --tls_ca          the CA the coordinator's certificate chains to (turns TLS on)
//   --tls_cert/--tls_key  a client certificate, where the servers want one
//   --tls_server_name the name in the coordinator's certificate, if not its host
//   --token_file      a file holding your user (or admin) token
// each also PSTRAIN_TLS_CA, ..., PSTRAIN_TOKEN_FILE.
#ifndef PSTRAIN_CLIENT_CLI_SECURITY_H_
#define PSTRAIN_CLIENT_CLI_SECURITY_H_

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "rpc/security.h"

namespace pstrain {

void AddSecurityOptions(CLI::App& app, SecurityOptions* options);
// Checks the files and makes them this process's security.
absl::Status InstallClientSecurity(const SecurityOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_CLI_SECURITY_H_
