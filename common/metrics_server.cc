#include "common/metrics_server.h"

#include <prometheus/exposer.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port,
                                                                     const std::string& port_file) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  try {
    // civetweb wants a bare port for "every interface".
    const std::string address = host == "0.0.0.0" || host.empty() ? std::to_string(port) : absl::StrCat(host, ":", port);
    m->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", host, ":", port, ": ", e.what()));
  }
  auto ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics: no listening port on ", host));
  m->port_ = ports.front();
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->exposer_->RegisterCollectable(m->registry_);
  if (!port_file.empty()) {
    absl::Status s = WriteFileAtomically(port_file, absl::StrCat("127.0.0.1:", m->port_, "\n"));
    if (!s.ok()) return s;
  }
  return m;
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::Add(std::shared_ptr<prometheus::Collectable> collectable) {
  exposer_->RegisterCollectable(collectable);
  collectables_.push_back(std::move(collectable));
}

}  // namespace pstrain
