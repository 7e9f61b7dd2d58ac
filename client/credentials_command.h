// `pstrain credentials`: a CA, one member certificate it signs (server and
// client use, for the names given) and a token file with a cluster, a user
// and an admin token -- what a secured cluster needs, for a first secured
// deployment without cert-manager, or a test cluster. Prints the flags each
// part takes.
#ifndef PSTRAIN_CLIENT_CREDENTIALS_COMMAND_H_
#define PSTRAIN_CLIENT_CREDENTIALS_COMMAND_H_

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace pstrain {

struct CredentialsArgs {
  std::string out;
  std::vector<std::string> dns = {"localhost"};
  std::vector<std::string> ips = {"127.0.0.1"};
  std::string user = "user";
  int days = 90;
};

// Adds the subcommand; `run` is set to its function.
CLI::App* AddCredentialsCommand(CLI::App& app, CredentialsArgs* args);
int RunCredentials(const CredentialsArgs& args);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_CREDENTIALS_COMMAND_H_
