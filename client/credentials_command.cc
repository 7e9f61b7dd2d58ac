#include "client/credentials_command.h"

#include <cstdio>

#include "rpc/local_credentials.h"

namespace pstrain {

CLI::App* AddCredentialsCommand(CLI::App& app, CredentialsArgs* a) {
  CLI::App* cmd = app.add_subcommand(
      "credentials", "make a CA, a member certificate and tokens for a secured cluster (prints the flags)");
  cmd->add_option("--out", a->out, "directory to write them to (created 0700)")->required();
  cmd->add_option("--dns", a->dns, "DNS names the certificate carries (wildcards: *.pstrain-ps)")->delimiter(',');
  cmd->add_option("--ip", a->ips, "IP addresses the certificate carries")->delimiter(',');
  cmd->add_option("--user", a->user, "name of the user token's user");
  cmd->add_option("--days", a->days, "validity of the certificates")->check(CLI::Range(1, 3650));
  return cmd;
}

int RunCredentials(const CredentialsArgs& a) {
  LocalCredentialsOptions o;
  o.alt_names.clear();
  for (const std::string& d : a.dns) {
    if (!d.empty()) o.alt_names.push_back("DNS:" + d);
  }
  for (const std::string& ip : a.ips) {
    if (!ip.empty()) o.alt_names.push_back("IP:" + ip);
  }
  if (o.alt_names.empty()) {
    std::fprintf(stderr, "pstrain: give the certificate at least one --dns name or --ip address\n");
    return 2;
  }
  o.user = a.user;
  o.valid_days = a.days;
  auto made = WriteLocalCredentials(a.out, o);
  if (!made.ok()) {
    std::fprintf(stderr, "pstrain: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  const LocalCredentials& c = *made;
  std::printf("wrote %s\n", a.out.c_str());
  std::printf("coordinator: --tls_cert=%s --tls_key=%s --tls_ca=%s --token_auth_file=%s --token_file=%s "
              "--table_grant_key_file=%s\n",
              c.cert.c_str(), c.key.c_str(), c.ca.c_str(), c.token_auth_file.c_str(), c.coordinator_token_file.c_str(),
              c.table_grant_key_file.c_str());
  std::printf("shards: --tls_cert=%s --tls_key=%s --tls_ca=%s --token_auth_file=%s --token_file=%s "
              "--table_grant_public_key_file=%s\n",
              c.cert.c_str(), c.key.c_str(), c.ca.c_str(), c.token_auth_file.c_str(), c.shard_token_file.c_str(),
              c.table_grant_public_key_file.c_str());
  std::printf("workers: --tls_cert=%s --tls_key=%s --tls_ca=%s --token_file=%s\n", c.cert.c_str(), c.key.c_str(),
              c.ca.c_str(), c.worker_token_file.c_str());
  std::printf("pstrain (user %s): --tls_ca=%s --token_file=%s   (admin: --token_file=%s)\n", a.user.c_str(),
              c.ca.c_str(), c.user_token_file.c_str(), c.admin_token_file.c_str());
  return 0;
}

}  // namespace pstrain
