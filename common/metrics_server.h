// MetricsServer: a Prometheus endpoint (HTTP GET /metrics) for a process,
// using prometheus-cpp. Binds "host:port" (port 0 picks one; port() reads it
// back). Metrics are registered on registry(); values computed at scrape
// time are added as Collectables.
#ifndef PSTRAIN_COMMON_METRICS_SERVER_H_
#define PSTRAIN_COMMON_METRICS_SERVER_H_

#include <prometheus/collectable.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
}

namespace pstrain {

class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              const std::string& port_file = "");
  ~MetricsServer();

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }
  // `collectable` must stay alive while registered (kept as a weak pointer).
  void Add(const std::shared_ptr<prometheus::Collectable>& collectable);

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_METRICS_SERVER_H_
