// The security flags every pstrain server binary takes (each also a
// PSTRAIN_* variable, see common/env_flags.h):
//   --tls_cert --tls_key        this process's certificate and key (PEM)
//   --tls_ca                    CA bundle peers must chain to; turns TLS on
//                               for this process's channels
//   --tls_client_auth           none|require (mutual TLS on its servers)
//   --tls_server_name           name expected in servers' certificates
//   --tls_refresh_s             how often certificate files are re-read
//   --token_file                the bearer token this process sends
//   --token_auth_file           the tokens its servers accept
#ifndef PSTRAIN_RPC_SECURITY_FLAGS_H_
#define PSTRAIN_RPC_SECURITY_FLAGS_H_

#include "rpc/security.h"

namespace pstrain {

// The flags as SecurityOptions, validated (files read and parsed) and set as
// this process's security; exits with status 2 and one line naming the flag
// when something is wrong. `server`: the binary serves gRPC.
SecurityOptions InstallSecurityFromFlags(const char* binary, bool server);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_SECURITY_FLAGS_H_
