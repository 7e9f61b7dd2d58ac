// PsClient over replicated shards (issue 34, docs/replication.md): where
// each chunk goes under the coordinator's routing, and calls that failed on
// a lost shard tried again at the chunk's new primary.
//
// A retry is safe because a push is idempotent per (worker, step) on every
// copy: the new primary either lacks the push (its primary died before
// forwarding the update: it applies it) or holds its result (it answers a
// duplicate with the values), and the primary forwards every update to its
// backups before it answers anyone, so no update a worker saw answered is
// lost with its shard.
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "common/routing_key.h"
#include "rpc/tensor_codec.h"
#include "worker/ps_client.h"

namespace pstrain {
namespace {

bool Contains(const google::protobuf::RepeatedField<uint32_t>& set, int x) {
  return std::find(set.begin(), set.end(), static_cast<uint32_t>(x)) != set.end();
}

// How long a retry waits for the coordinator's next routing before it tries
// the current one again (a shard that was only briefly unreachable).
constexpr absl::Duration kRoutingWait = absl::Seconds(1);
// How long the routing watcher waits for a spare's InitTable before it
// tries again on its next round.
constexpr absl::Duration kSpareTableWait = absl::Seconds(10);

}  // namespace

std::shared_ptr<const PsClient::Route> PsClient::route() const {
  absl::MutexLock lock(&route_mu_);
  return route_;
}

std::shared_ptr<const PsClient::Route> PsClient::MakeRoute(const Routing& routing, const Route* previous) const {
  const PartitionPlan& plan = options_.plan;
  auto r = std::make_shared<Route>();
  r->generation = routing.generation();
  // Each shard's address and client: a spare in a lost shard's place is at
  // a new address.
  const size_t n = shards_.size();
  r->targets = routing.targets_size() == static_cast<int>(n)
                   ? std::vector<std::string>(routing.targets().begin(), routing.targets().end())
                   : previous != nullptr ? previous->targets
                                         : options_.shard_targets;
  r->targets.resize(n);
  r->routing = routing;
  r->routing.clear_targets();
  for (const std::string& t : r->targets) r->routing.add_targets(t);
  for (size_t s = 0; s < n; ++s) {
    if (previous == nullptr) {
      r->shards.push_back(shards_[s]);
    } else if (previous->targets[s] == r->targets[s] || !options_.connect) {
      r->shards.push_back(previous->shards[s]);
    } else {
      r->shards.push_back(options_.connect(r->targets[s]));
    }
  }
  r->leader.assign(plan.chunks.size(), -1);
  r->shard_chunks.assign(shards_.size(), {});
  r->lost.assign(shards_.size(), false);
  for (uint32_t s : routing.lost_shards()) {
    if (s < r->lost.size()) r->lost[s] = true;
  }
  r->param_chunks.assign(plan.params.size(), std::vector<std::vector<size_t>>(shards_.size()));
  // The same rule as the shards' (table/shard_store_replication.cc): a
  // chunk's first copy, primary then backups, neither lost nor catching up.
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ChunkSpec& c = plan.chunks[i];
    std::vector<int> copies = {c.shard};
    copies.insert(copies.end(), c.backups.begin(), c.backups.end());
    for (int s : copies) {
      if (!Contains(routing.lost_shards(), s) && !Contains(routing.catching_up(), s)) {
        r->leader[i] = s;
        break;
      }
    }
  }
  // Each shard's chunks in the plan's order: its own first (as the plan
  // lists them), then those it took over, in chunk order.
  for (size_t s = 0; s < shards_.size() && s < plan.shard_chunks.size(); ++s) {
    for (size_t id : plan.shard_chunks[s]) {
      if (r->leader[id] == static_cast<int>(s)) r->shard_chunks[s].push_back(id);
    }
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const int s = r->leader[i];
    if (s >= 0 && s != plan.chunks[i].shard) r->shard_chunks[s].push_back(i);
    if (s >= 0) r->param_chunks[plan.chunks[i].param][s].push_back(i);
  }
  if (view_chunk_ != SIZE_MAX && r->leader[view_chunk_] >= 0) {
    r->view_shard = static_cast<size_t>(r->leader[view_chunk_]);
    auto& ids = r->shard_chunks[r->view_shard];
    auto at = std::find(ids.begin(), ids.end(), view_chunk_);
    std::rotate(ids.begin(), at,
                at + 1);  // first: its shard reports the ranks' view
  }
  return r;
}

void PsClient::AwaitRouting(uint64_t seen, absl::Time deadline) {
  if (!replicated()) return;
  absl::Duration wait = std::min(kRoutingWait, std::max(absl::ZeroDuration(), deadline - absl::Now()));
  uint64_t generation = seen;
  std::optional<Routing> newest;
  // Several changes may have come: take them all, the newest wins.
  while (true) {
    absl::StatusOr<Routing> next = options_.next_routing(generation, wait);
    if (!next.ok() || next->generation() <= generation) break;
    generation = next->generation();
    newest = std::move(*next);
    wait = absl::ZeroDuration();
  }
  if (!newest.has_value()) return;
  if (newest->lost_shards_size() > static_cast<int>(shards_.size()) ||
      newest->catching_up_size() > static_cast<int>(shards_.size()) ||
      (newest->targets_size() != 0 && newest->targets_size() != static_cast<int>(shards_.size()))) {
    return;  // not this table's routing
  }
  std::shared_ptr<const Route> r, before;
  {
    absl::MutexLock lock(&route_mu_);
    if (newest->generation() <= route_->generation) return;
    before = route_;
    r = MakeRoute(*newest, route_.get());
    route_ = r;
  }
  // A shard declared lost now: its calls in flight fail at once and go to
  // the new primaries, instead of waiting out their deadline on a shard
  // that hangs (a SIGSTOP, a dead host's unanswered connection).
  for (size_t s = 0; s < r->lost.size() && s < before->lost.size(); ++s) {
    if (r->lost[s] && !before->lost[s]) before->shards[s]->CancelCalls();
  }
}

void PsClient::InitTableOn(const Route& route, int shard, const std::vector<at::Tensor>& params,
                           const TableConfig& config, const Routing& routing, InitTableRequest* request,
                           InitTableResponse* response, const CallOptions& opts, StatusCallback done) {
  const PartitionPlan& plan = options_.plan;
  if (options_.whole_plan.num_shards > 0) {
    return InitPipelinedTableOn(route, shard, params, config, request, response, opts, std::move(done));
  }
  // A replicated table: the chunks the shard leads and those it backs up,
  // each with its copies (primary first), in chunk order.
  std::vector<size_t> ids = plan.shard_chunks[shard];
  if (plan.replicas > 0) {
    ids.insert(ids.end(), plan.shard_backup_chunks[shard].begin(), plan.shard_backup_chunks[shard].end());
    std::sort(ids.begin(), ids.end());
  }
  auto views = ChunkViews(params, ids);
  if (!views.ok()) return done(views.status());
  InitTableRequest& req = Addressed(*request, ids);
  *req.mutable_config() = config;
  if (plan.replicas > 0) {
    req.set_shard(static_cast<uint32_t>(shard));
    *req.mutable_routing() = routing;
    for (size_t id : ids) {
      auto* copies = req.add_copies()->mutable_shards();
      copies->Add(plan.chunks[id].shard);
      for (int b : plan.chunks[id].backups) copies->Add(b);
    }
  }
  route.shards[shard]->InitTableAsync(req, std::move(*views), response, opts, std::move(done));
}

void PsClient::InitPipelinedTableOn(const Route& route, int shard, const std::vector<at::Tensor>& params,
                                    const TableConfig& config, InitTableRequest* request,
                                    InitTableResponse* response, const CallOptions& opts, StatusCallback done) {
  const PartitionPlan& whole = options_.whole_plan;
  std::unordered_map<std::string, size_t> own;  // key -> chunk of this stage's plan
  for (size_t id : options_.plan.shard_chunks[shard]) own.emplace(options_.plan.chunks[id].key, id);
  InitTableRequest& req = *request;
  req.set_job(options_.job);
  req.set_attempt(options_.attempt);
  *req.mutable_config() = config;
  req.set_stage(options_.stage);
  std::vector<size_t> ids;  // this stage's chunks, in the shard's key order
  for (size_t w : whole.shard_chunks[shard]) {
    const ChunkSpec& c = whole.chunks[w];
    auto it = own.find(c.key);
    if (it != own.end()) {
      req.add_own_keys(static_cast<uint32_t>(req.keys_size()));
      ids.push_back(it->second);
    } else {
      KeyLayout* layout = req.add_layouts();
      layout->set_dtype(whole.params[c.param].dtype);
      layout->add_shape(c.numel);
    }
    req.add_keys(c.key);
  }
  if (ids.size() != own.size()) {
    return done(absl::InternalError(
        absl::StrCat("shard ", shard, ": the stage's plan has chunks the whole plan does not")));
  }
  auto views = ChunkViews(params, ids);
  if (!views.ok()) return done(views.status());
  route.shards[shard]->InitTableAsync(req, std::move(*views), response, opts, std::move(done));
}

void PsClient::InitCatchingUp(const Route& route) {
  std::vector<at::Tensor> zeros;
  for (uint32_t s : route.routing.catching_up()) {
    if (s >= route.targets.size()) continue;
    // Once per spare and routing generation: a spare that came back
    // holding a leftover table gets the routing with it.
    const std::string target = absl::StrCat(route.targets[s], "@", route.generation);
    {
      absl::MutexLock lock(&catching_up_mu_);
      if (!config_.has_value() || tables_made_.count(target) > 0) continue;
    }
    // A spare needs the table before its primaries can copy it the chunks
    // (each worker offers it; the first makes it, with the routing).
    for (size_t p = zeros.size(); p < options_.plan.params.size(); ++p) {
      absl::StatusOr<c10::ScalarType> type = ToScalarType(options_.plan.params[p].dtype);
      if (!type.ok()) return;
      zeros.push_back(at::zeros(options_.plan.params[p].shape, at::TensorOptions().dtype(*type)));
    }
    CallOptions opts = NewCallOptions();
    opts.deadline = std::min(opts.deadline, absl::Now() + kSpareTableWait);
    opts.table_grant = options_.table_grant;
    InitTableRequest request;
    InitTableResponse response;
    absl::Status made = WaitFor([&](StatusCallback done) {
      InitTableOn(route, static_cast<int>(s), zeros, *config_, route.routing, &request, &response, opts,
                  std::move(done));
    });
    if (made.ok()) {
      absl::MutexLock lock(&catching_up_mu_);
      tables_made_.insert(target);
    }
  }
}

void PsClient::WatchRoutings(const TableConfig& config) {
  if (watcher_ != nullptr) return;
  {
    absl::MutexLock lock(&catching_up_mu_);
    config_ = config;
  }
  watcher_ = std::make_unique<std::thread>([this] {
    while (true) {
      {
        absl::MutexLock lock(&failover_mu_);
        if (failover_stop_) return;
      }
      AwaitRouting(route()->generation, absl::Now() + kRoutingWait);
      // Here only, off the training thread: an InitTable may wait.
      InitCatchingUp(*route());
    }
  });
}

bool PsClient::Stopped() const { return options_.stop != nullptr && options_.stop->load(); }

absl::Status PsClient::Cancelled(const absl::Status& failure) {
  return absl::CancelledError(
      absl::StrCat("the job was stopped while a shard call failed over (", failure.message(), ")"));
}

absl::Status PsClient::WithFailover(const std::function<absl::Status(const Route&)>& op) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (true) {
    const std::shared_ptr<const Route> r = route();
    absl::Status s = op(*r);
    if (s.ok() || !replicated() || !MayFailOver(s) || absl::Now() >= deadline) return s;
    if (Stopped()) return Cancelled(s);
    AwaitRouting(r->generation, deadline);
    // No newer routing for a failure only a routing mends: it stays.
    if (s.code() != absl::StatusCode::kUnavailable && route()->generation == r->generation) return s;
  }
}

void PsClient::PartDone(const std::shared_ptr<AsyncPushPull>& state, size_t k, absl::Status status) {
  const size_t s = state->parts[k].shard;
  if (status.ok() && state->parts[k].has_view) RecordView(state->responses[k].vacant_ranks());
  {
    absl::MutexLock lock(&state->mu);
    state->status[k] = ShardError(s, status);
    if (--state->outstanding > 0) return;
  }
  // The last part of the round to end: the bucket's outcome, or a retry of
  // the parts that failed on a lost shard.
  absl::Status first;
  bool retry = replicated();
  {
    absl::MutexLock lock(&state->mu);
    for (size_t j = 0; j < state->status.size(); ++j) {
      const absl::Status& st = state->status[j];
      if (st.ok()) continue;
      if (first.ok()) first = st;
      // Not sent (its views were refused): no retry can mend it.
      retry = retry && MayFailOver(st) && state->wire[j].size() == state->parts[j].ids.size();
    }
  }
  if (first.ok()) return state->done(absl::OkStatus());
  if (!retry || absl::Now() >= state->deadline) return state->done(first);
  if (Stopped()) return state->done(Cancelled(first));
  // Waiting for the coordinator's routing blocks: not on a gRPC thread.
  OnFailoverThread([this, state, first] {
    const uint64_t seen = state->generation;
    AwaitRouting(seen, state->deadline);
    if (Stopped()) return state->done(Cancelled(first));
    const std::shared_ptr<const Route> r = route();
    if (first.code() != absl::StatusCode::kUnavailable && r->generation == seen) return state->done(first);
    IssueParts(state, *r);
  });
}

void PsClient::IssueParts(const std::shared_ptr<AsyncPushPull>& state, const Route& route) {
  // The chunks of the failed parts, regrouped by their leader now; each
  // keeps the gradient bytes it was sent with (a duplicate must be the
  // same push) and its destination.
  struct Piece {
    std::vector<size_t> ids;
    std::vector<TensorBuffer> wire, dest;
  };
  std::map<int, Piece> by_shard;
  {
    absl::MutexLock lock(&state->mu);
    for (size_t j = 0; j < state->parts.size(); ++j) {
      if (state->status[j].ok()) continue;
      for (size_t i = 0; i < state->parts[j].ids.size(); ++i) {
        const size_t id = state->parts[j].ids[i];
        const int leader = route.leader[id];
        if (leader < 0) {
          return state->done(absl::UnavailableError(
              absl::StrCat("no copy of key '", options_.plan.chunks[id].key,
                           "' is left: every shard holding it was lost (replicas: ", options_.plan.replicas, ")")));
        }
        Piece& p = by_shard[leader];
        p.ids.push_back(id);
        p.wire.push_back(state->wire[j][i]);
        p.dest.push_back(state->dest[j][i]);
      }
    }
  }
  std::vector<RequestPart> parts;
  std::vector<Piece> pieces;
  for (auto& [shard, piece] : by_shard) {
    auto at = std::find(piece.ids.begin(), piece.ids.end(), view_chunk_);
    const bool has_view = at != piece.ids.end();
    if (has_view) {
      const size_t i = static_cast<size_t>(at - piece.ids.begin());
      std::swap(piece.ids[0], piece.ids[i]);
      std::swap(piece.wire[0], piece.wire[i]);
      std::swap(piece.dest[0], piece.dest[i]);
    }
    parts.push_back(RequestPart{static_cast<size_t>(shard), piece.ids, has_view});
    pieces.push_back(std::move(piece));
  }
  state->generation = route.generation;
  state->parts = std::move(parts);
  state->Reset(state->parts.size());
  const CallOptions opts = NewCallOptions();
  for (size_t k = 0; k < state->parts.size(); ++k) {
    state->wire[k] = std::move(pieces[k].wire);
    state->dest[k] = std::move(pieces[k].dest);
    state->values[k] = state->dest[k];
    AddressedPush(state->requests[k], state->parts[k].ids, state->step, state->lr);
  }
  for (size_t k = 0; k < state->parts.size(); ++k) {
    const size_t s = state->parts[k].shard;
    ParameterStore* store = route.shards[s];
    Admit(s, [this, state, k, s, store, opts] {
      state->sent[k] = absl::Now();
      for (const TensorBuffer& b : state->wire[k]) state->bytes[k] += 2 * static_cast<int64_t>(b.nbytes);
      store->PushPullAsync(state->requests[k], state->wire[k], &state->responses[k], &state->values[k], opts,
                                [this, state, k, s](absl::Status st) {
                                  Release(s);
                                  PartDone(state, k, std::move(st));
                                });
    });
  }
}

void PsClient::OnFailoverThread(std::function<void()> task) {
  absl::MutexLock lock(&failover_mu_);
  if (failover_stop_) return;
  failover_tasks_.push_back(std::move(task));
  if (failover_thread_ != nullptr) return;
  failover_thread_ = std::make_unique<std::thread>([this] {
    while (true) {
      std::function<void()> next;
      {
        absl::MutexLock lock(&failover_mu_);
        failover_mu_.Await(absl::Condition(
            +[](PsClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->failover_mu_) {
              return c->failover_stop_ || !c->failover_tasks_.empty();
            },
            this));
        if (failover_tasks_.empty()) return;  // stopping, nothing left
        next = std::move(failover_tasks_.front());
        failover_tasks_.pop_front();
      }
      next();
    }
  });
}

PsClient::~PsClient() {
  {
    absl::MutexLock lock(&failover_mu_);
    failover_stop_ = true;
  }
  if (failover_thread_ != nullptr) failover_thread_->join();
  if (watcher_ != nullptr) watcher_->join();  // within a routing wait (a second)
}

}  // namespace pstrain
