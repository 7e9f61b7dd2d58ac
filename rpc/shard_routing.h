// Replicated shards (docs/replication.md), a pool worker's side: where the
// coordinator's routings come from, and clients for spare shards at new
// addresses -- what PsClientOptions::next_routing and ::connect want.
#ifndef PSTRAIN_RPC_SHARD_ROUTING_H_
#define PSTRAIN_RPC_SHARD_ROUTING_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/parameter.pb.h"
#include "table/parameter_store.h"

namespace pstrain {

class ClusterMember;

// The routing after `generation`, from the job's KV store (routing/<g>,
// written by the coordinator only), waiting up to `wait`: NOT_FOUND when
// none came. `member` must outlive the function.
std::function<absl::StatusOr<Routing>(uint64_t generation, absl::Duration wait)> RoutingsFrom(
    ClusterMember* member);

// A gRPC client per new address, kept as long as the function (or a copy)
// lives; calls without a deadline of their own get `timeout`.
std::function<ParameterStore*(const std::string& target)> SpareShardClients(absl::Duration timeout);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_SHARD_ROUTING_H_
