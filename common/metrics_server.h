// MetricsServer: a Prometheus endpoint (HTTP GET /metrics) for a process,
// using prometheus-cpp. Binds "host:port" (port 0 picks one; port() reads it
// back). Metrics are registered on registry(); values computed at scrape
// time are added as Collectables.
#ifndef PSTRAIN_COMMON_METRICS_SERVER_H_
#define PSTRAIN_COMMON_METRICS_SERVER_H_

#include <prometheus/collectable.h>
#include <prometheus/registry.h>

#include <memory>
#include <vector>
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
  // Serves `collectable` from now on; the server keeps it alive (the
  // exposer itself holds only a weak pointer: a collector handed over as a
  // temporary was once silently dropped).
  void Add(std::shared_ptr<prometheus::Collectable> collectable);

 private:
  MetricsServer() = default;
  // Declared before the exposer, so it is destroyed after it: no scrape
  // runs on a collector that is gone.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_METRICS_SERVER_H_
