#include "rpc/shard_routing.h"

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/routing_key.h"
#include "rpc/cluster_member.h"
#include "rpc/grpc_remote_shard.h"

namespace pstrain {

std::function<absl::StatusOr<Routing>(uint64_t, absl::Duration)> RoutingsFrom(ClusterMember* member) {
  return [member](uint64_t generation, absl::Duration wait) -> absl::StatusOr<Routing> {
    absl::StatusOr<std::string> value = member->KvGet(RoutingKey(generation + 1), wait);
    if (!value.ok()) return value.status();
    Routing routing;
    if (!routing.ParseFromString(*value)) return absl::DataLossError("the coordinator's routing does not parse");
    return routing;
  };
}

std::function<ParameterStore*(const std::string&)> SpareShardClients(absl::Duration timeout) {
  struct Spares {
    absl::Mutex mu;
    std::vector<std::shared_ptr<GrpcRemoteShard>> clients ABSL_GUARDED_BY(mu);
  };
  return [spares = std::make_shared<Spares>(), timeout](const std::string& target) -> ParameterStore* {
    RemoteShardOptions ro;
    ro.target = target;
    ro.default_timeout = timeout;
    ro.max_attempts = 2;  // as the job's other shards' (worker/main.cc)
    absl::MutexLock lock(&spares->mu);
    spares->clients.push_back(SharedRemoteShard(ro));
    return spares->clients.back().get();
  };
}

}  // namespace pstrain
