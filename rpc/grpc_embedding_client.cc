#include "rpc/grpc_embedding_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fan_out.h"
#include "common/routing_key.h"
#include "embedding/row_math.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/status_util.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

// A call's outcome, named by its shard.
absl::Status OfShard(size_t shard, const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status a = FromGrpcStatus(s);
  return absl::Status(a.code(), absl::StrCat("embedding shard ", shard, ": ", a.message()));
}

// How long a retry waits for the coordinator's next routing before it tries
// the current one again (a shard that was only briefly unreachable).
constexpr absl::Duration kRoutingWait = absl::Seconds(1);

}  // namespace

GrpcEmbeddingClient::GrpcEmbeddingClient(std::vector<std::shared_ptr<grpc::Channel>> shards,
                                         EmbeddingClientOptions options)
    : options_(std::move(options)) {
  for (auto& channel : shards) stubs_.push_back(EmbeddingService::NewStub(channel));
  absl::MutexLock lock(&mu_);
  for (size_t s = 0; s < stubs_.size(); ++s) leader_.push_back(static_cast<int64_t>(s));
  for (const std::string& t : options_.targets) routing_.add_targets(t);
  retained_.resize(stubs_.size());
  resend_.assign(stubs_.size(), 0);
}

uint64_t GrpcEmbeddingClient::routing_generation() const {
  absl::MutexLock lock(&mu_);
  return routing_.generation();
}

std::unique_ptr<grpc::ClientContext> GrpcEmbeddingClient::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  if (!options_.job_secret.empty()) context->AddMetadata(kJobSecretMetadata, options_.job_secret);
  return context;
}

absl::Status GrpcEmbeddingClient::Init(InitEmbeddingsRequest request) {
  request.set_job(options_.job);
  request.set_attempt(options_.attempt);
  request.set_num_shards(static_cast<uint32_t>(stubs_.size()));
  if (replicated()) {
    if (options_.targets.size() != stubs_.size()) {
      return absl::InvalidArgumentError("replicated embedding tables need every shard's address");
    }
    request.set_replicas(options_.replicas);
    absl::MutexLock lock(&mu_);
    *request.mutable_routing() = routing_;
  }
  tables_.clear();
  for (EmbeddingTableConfig& t : *request.mutable_tables()) {
    absl::Status s = NormalizeEmbeddingConfig(&t);
    if (!s.ok()) return s;
    tables_.push_back(t);
  }
  const size_t n = stubs_.size();
  std::vector<InitEmbeddingsRequest> requests(n, request);
  std::vector<InitEmbeddingsResponse> responses(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  FanOut calls;
  for (size_t s = 0; s < n; ++s) {
    requests[s].set_shard_index(static_cast<uint32_t>(s));
    contexts[s] = Context();
    if (!options_.table_grant.empty()) contexts[s]->AddMetadata(kTableGrantMetadata, options_.table_grant);
    calls.Add();
    stubs_[s]->async()->InitEmbeddings(contexts[s].get(), &requests[s], &responses[s],
                                       [&calls, s](grpc::Status st) { calls.Done(OfShard(s, st)); });
  }
  return calls.Wait();
}

std::vector<std::vector<std::vector<uint32_t>>> GrpcEmbeddingClient::Route(
    const std::vector<std::vector<int64_t>>& ids) const {
  const uint32_t n = static_cast<uint32_t>(stubs_.size());
  std::vector<std::vector<std::vector<uint32_t>>> at(n, std::vector<std::vector<uint32_t>>(ids.size()));
  for (size_t t = 0; t < ids.size(); ++t) {
    const uint32_t vshards = tables_[t].virtual_shards();
    for (size_t i = 0; i < ids[t].size(); ++i)
      at[ShardOfId(ids[t][i], vshards, n)][t].push_back(static_cast<uint32_t>(i));
  }
  return at;
}

void GrpcEmbeddingClient::AwaitRouting(uint64_t seen, absl::Time deadline) {
  const absl::Duration wait = std::max(absl::ZeroDuration(), std::min(kRoutingWait, deadline - absl::Now()));
  if (!options_.next_routing) {
    absl::SleepFor(wait);
    return;
  }
  absl::StatusOr<Routing> next = options_.next_routing(seen, wait);
  if (next.ok()) AdoptRouting(*next);  // else none yet: the current routing is tried again
}

void GrpcEmbeddingClient::AdoptRouting(const Routing& next) {
  const size_t n = stubs_.size();
  absl::MutexLock lock(&mu_);
  if (next.generation() <= routing_.generation()) return;
  for (uint32_t lost : next.lost_shards()) {
    if (lost >= n) return;  // not this job's layout
  }
  for (uint32_t s : next.catching_up()) {
    if (s >= n) return;
  }
  // A spare in a lost shard's place is at a new address.
  if (next.targets_size() == static_cast<int>(n)) {
    for (size_t s = 0; s < n; ++s) {
      if (s < static_cast<size_t>(routing_.targets_size()) && routing_.targets(s) == next.targets(s)) continue;
      stubs_[s] = EmbeddingService::NewStub(CreateChannel(next.targets(s)));
    }
  }
  routing_ = next;
  auto in = [](const google::protobuf::RepeatedField<uint32_t>& set, uint32_t x) {
    return std::find(set.begin(), set.end(), x) != set.end();
  };
  for (size_t h = 0; h < n; ++h) {
    int64_t leader = static_cast<int64_t>(h);
    for (uint32_t c = 0; c <= options_.replicas && c < n; ++c) {  // the first copy neither lost nor catching up
      const uint32_t s = static_cast<uint32_t>((h + c) % n);
      if (!in(routing_.lost_shards(), s) && !in(routing_.catching_up(), s)) {
        leader = s;
        break;
      }
    }
    if (leader != leader_[h]) {
      leader_[h] = leader;
      resend_[h] = retained_[h].job().empty() ? 0 : 1;
    }
  }
}

absl::Status GrpcEmbeddingClient::Resend(const std::vector<size_t>& slots, const std::vector<int64_t>& leader) {
  for (size_t h : slots) {
    EmbeddingUpdateRequest retained;
    std::shared_ptr<EmbeddingService::Stub> stub;
    {
      absl::MutexLock lock(&mu_);
      if (!resend_[h]) continue;
      retained = retained_[h];
      stub = stubs_[leader[h]];
    }
    auto context = Context();
    EmbeddingUpdateResponse response;
    absl::Status s = OfShard(leader[h], stub->Update(context.get(), retained, &response));
    if (!s.ok()) return s;
    absl::MutexLock lock(&mu_);
    resend_[h] = 0;
  }
  return absl::OkStatus();
}

template <typename Request, typename Response, typename Call>
absl::Status GrpcEmbeddingClient::CallSlots(const std::vector<size_t>& slots, std::vector<Request>* requests,
                                            std::vector<Response>* responses, Call call) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  std::vector<size_t> pending = slots;
  for (;;) {
    std::vector<int64_t> leader;
    std::vector<std::shared_ptr<EmbeddingService::Stub>> stubs;
    uint64_t generation = 0;
    {
      absl::MutexLock lock(&mu_);
      leader = leader_;
      stubs = stubs_;
      generation = routing_.generation();
    }
    std::vector<absl::Status> got(stubs_.size());
    const absl::Status resent = replicated() ? Resend(pending, leader) : absl::OkStatus();
    for (size_t h : pending) got[h] = resent;  // not sent: tried again with the rest
    if (resent.ok()) {
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts(stubs_.size());
      absl::Mutex m;
      size_t outstanding = pending.size();
      for (size_t h : pending) {
        if (replicated()) (*requests)[h].set_slot(static_cast<uint32_t>(h));
        contexts[h] = Context();
        const size_t to = static_cast<size_t>(leader[h]);
        call(stubs[to].get(), contexts[h].get(), &(*requests)[h], &(*responses)[h],
             [&m, &outstanding, &got, h, to](grpc::Status st) {
               absl::MutexLock lock(&m);
               got[h] = OfShard(to, st);
               --outstanding;
             });
      }
      // A shard that hangs (a stopped process, a host whose connections
      // stay open) answers nothing: once a routing says it is lost, its
      // calls are cancelled and go to the new leaders.
      for (;;) {
        {
          absl::MutexLock lock(&m);
          if (m.AwaitWithTimeout(absl::Condition(+[](size_t* n) { return *n == 0; }, &outstanding), kRoutingWait)) {
            break;
          }
        }
        if (!replicated() || !options_.next_routing) continue;
        if (options_.stop != nullptr && options_.stop->load()) {
          for (size_t h : pending) contexts[h]->TryCancel();
          continue;
        }
        absl::StatusOr<Routing> next = options_.next_routing(generation, absl::ZeroDuration());
        if (!next.ok()) continue;
        AdoptRouting(*next);
        absl::MutexLock lock(&mu_);
        for (size_t h : pending) {
          if (leader_[h] != leader[h]) contexts[h]->TryCancel();
        }
      }
    }
    std::vector<size_t> failed;
    for (size_t h : pending) {
      if (got[h].ok()) continue;
      if (!replicated() || !MayFailOver(got[h])) return got[h];
      failed.push_back(h);
    }
    if (failed.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) return got[failed[0]];
    if (options_.stop != nullptr && options_.stop->load()) {
      return absl::CancelledError(absl::StrCat("the job is stopping: ", got[failed[0]].message()));
    }
    // Once a second at most (AwaitRouting waits that long for a routing):
    // a call that keeps failing over says where it is stuck.
    spdlog::warn("rank {}: embedding call to slot {} on shard {} failed under routing generation {} ({}); "
                 "trying again on the leader of the next routing",
                 options_.rank, failed[0], leader[failed[0]], generation, got[failed[0]].ToString());
    AwaitRouting(generation, deadline);
    pending = std::move(failed);
  }
}

namespace {

// A lookup's or update's fields for one slot: who asks, for which step,
// and the ids of each table that go to that slot.
template <typename Request>
void Fill(const EmbeddingClientOptions& o, int64_t step, const std::vector<EmbeddingTableConfig>& tables,
          const std::vector<std::vector<int64_t>>& ids, const std::vector<std::vector<uint32_t>>& positions,
          Request* request) {
  request->set_job(o.job);
  request->set_attempt(o.attempt);
  request->set_rank(o.rank);
  request->set_step(step);
  for (size_t t = 0; t < ids.size(); ++t) {
    EmbeddingIds* e = request->add_tables();
    e->set_table(tables[t].name());
    std::string* bytes = e->mutable_ids();
    bytes->resize(positions[t].size() * sizeof(int64_t));
    char* out = bytes->data();
    for (uint32_t i : positions[t]) {
      std::memcpy(out, &ids[t][i], sizeof(int64_t));
      out += sizeof(int64_t);
    }
  }
}

}  // namespace

absl::Status GrpcEmbeddingClient::Lookup(int64_t step, const std::vector<std::vector<int64_t>>& ids,
                                         std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) {
  if (ids.size() != tables_.size()) return absl::InvalidArgumentError("one id list per embedding table");
  const auto at = Route(ids);
  const size_t n = stubs_.size();
  rows->resize(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) (*rows)[t].assign(ids[t].size() * tables_[t].dim(), 0.0f);
  std::vector<EmbeddingLookupRequest> requests(n);
  std::vector<EmbeddingLookupResponse> responses(n);
  std::vector<size_t> asked;
  for (size_t s = 0; s < n; ++s) {
    bool any = false;
    for (const auto& p : at[s]) any = any || !p.empty();
    if (!any) continue;  // a slot with none of the batch's ids is not asked
    asked.push_back(s);
    Fill(options_, step, tables_, ids, at[s], &requests[s]);
    requests[s].set_read_only(kind == EmbeddingLookupKind::kReadOnly);
  }
  if (asked.empty()) return absl::OkStatus();
  absl::Status e = CallSlots(asked, &requests, &responses,
                             [](EmbeddingService::Stub* stub, grpc::ClientContext* c, const EmbeddingLookupRequest* r,
                                EmbeddingLookupResponse* out, std::function<void(grpc::Status)> done) {
                               stub->async()->Lookup(c, r, out, std::move(done));
                             });
  if (!e.ok()) return e;
  for (size_t s : asked) {
    if (responses[s].values_size() != static_cast<int>(ids.size())) {
      return absl::InternalError(
          absl::StrCat("embedding slot ", s, " answered ", responses[s].values_size(), " tables for ", ids.size()));
    }
    for (size_t t = 0; t < ids.size(); ++t) {
      const size_t row_bytes = tables_[t].dim() * sizeof(float);
      const std::string& v = responses[s].values(static_cast<int>(t));
      if (v.size() != at[s][t].size() * row_bytes) {
        return absl::InternalError(absl::StrCat("embedding slot ", s, " answered ", v.size(), " bytes for table '",
                                                tables_[t].name(), "', not ", at[s][t].size() * row_bytes));
      }
      for (size_t k = 0; k < at[s][t].size(); ++k) {
        std::memcpy(&(*rows)[t][static_cast<size_t>(at[s][t][k]) * tables_[t].dim()], v.data() + k * row_bytes,
                    row_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GrpcEmbeddingClient::Update(int64_t step, const std::vector<std::vector<int64_t>>& ids,
                                         const std::vector<const float*>& grads, uint32_t extra_batches,
                                         bool empty) {
  if (ids.size() != tables_.size() || grads.size() != tables_.size()) {
    return absl::InvalidArgumentError("one id list and one gradient block per embedding table");
  }
  const auto at = Route(ids);
  const size_t n = stubs_.size();
  std::vector<EmbeddingUpdateRequest> requests(n);
  std::vector<EmbeddingUpdateResponse> responses(n);
  std::vector<size_t> slots;
  for (size_t s = 0; s < n; ++s) {
    slots.push_back(s);
    EmbeddingUpdateRequest& r = requests[s];
    Fill(options_, step, tables_, ids, at[s], &r);
    r.set_extra_batches(extra_batches);
    r.set_empty(empty);
    for (size_t t = 0; t < ids.size(); ++t) {
      const size_t row_bytes = tables_[t].dim() * sizeof(float);
      std::string* g = r.add_grads();
      g->resize(at[s][t].size() * row_bytes);
      for (size_t k = 0; k < at[s][t].size(); ++k) {
        std::memcpy(g->data() + k * row_bytes, grads[t] + static_cast<size_t>(at[s][t][k]) * tables_[t].dim(),
                    row_bytes);
      }
    }
    if (replicated()) {
      r.set_slot(static_cast<uint32_t>(s));
      absl::MutexLock lock(&mu_);
      retained_[s] = r;  // this one is sent itself: no earlier one needs sending again
      resend_[s] = 0;
    }
  }
  return CallSlots(slots, &requests, &responses,
                   [](EmbeddingService::Stub* stub, grpc::ClientContext* c, const EmbeddingUpdateRequest* r,
                      EmbeddingUpdateResponse* out, std::function<void(grpc::Status)> done) {
                     stub->async()->Update(c, r, out, std::move(done));
                   });
}

absl::Status DropEmbeddings(const std::shared_ptr<grpc::Channel>& shard, const std::string& job, uint64_t attempt,
                            const std::string& job_secret, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!job_secret.empty()) context.AddMetadata(kJobSecretMetadata, job_secret);
  DropEmbeddingsRequest request;
  request.set_job(job);
  request.set_attempt(attempt);
  DropEmbeddingsResponse response;
  return FromGrpcStatus(EmbeddingService::NewStub(shard)->DropEmbeddings(&context, request, &response));
}

std::shared_ptr<grpc::ClientContext> SaveEmbeddingsAsync(const std::shared_ptr<grpc::Channel>& shard,
                                                         const SaveEmbeddingsRequest& request,
                                                         const std::string& job_secret, absl::Time deadline,
                                                         SaveEmbeddingsResponse* response,
                                                         std::function<void(absl::Status)> done) {
  // What must outlive the call: held by its callback, and by the caller
  // through the context it gets back.
  struct Call {
    grpc::ClientContext context;
    SaveEmbeddingsRequest request;
    std::unique_ptr<EmbeddingService::Stub> stub;
  };
  auto call = std::make_shared<Call>();
  call->context.set_deadline(absl::ToChronoTime(deadline));
  if (!job_secret.empty()) call->context.AddMetadata(kJobSecretMetadata, job_secret);
  call->request = request;
  call->stub = EmbeddingService::NewStub(shard);
  call->stub->async()->SaveEmbeddings(&call->context, &call->request, response,
                                      [call, done = std::move(done)](grpc::Status s) { done(FromGrpcStatus(s)); });
  return std::shared_ptr<grpc::ClientContext>(call, &call->context);
}

absl::Status LoadEmbeddings(const std::shared_ptr<grpc::Channel>& shard, const LoadEmbeddingsRequest& request,
                            const std::string& job_secret, absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!job_secret.empty()) context.AddMetadata(kJobSecretMetadata, job_secret);
  LoadEmbeddingsResponse response;
  return FromGrpcStatus(EmbeddingService::NewStub(shard)->LoadEmbeddings(&context, request, &response));
}

absl::Status ReplicateEmbeddings(const std::shared_ptr<grpc::Channel>& shard, const ReplicateEmbeddingsRequest& request,
                                 const std::string& job_secret, absl::Time deadline,
                                 ReplicateEmbeddingsResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!job_secret.empty()) context.AddMetadata(kJobSecretMetadata, job_secret);
  return FromGrpcStatus(EmbeddingService::NewStub(shard)->ReplicateEmbeddings(&context, request, response));
}

absl::StatusOr<EmbeddingStatsResponse> FetchEmbeddingStats(const std::shared_ptr<grpc::Channel>& shard,
                                                           const std::string& job, const std::string& job_secret,
                                                           absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!job_secret.empty()) context.AddMetadata(kJobSecretMetadata, job_secret);
  EmbeddingStatsRequest request;
  request.set_job(job);
  EmbeddingStatsResponse response;
  absl::Status s = FromGrpcStatus(EmbeddingService::NewStub(shard)->Stats(&context, request, &response));
  if (!s.ok()) return s;
  return response;
}

}  // namespace pstrain
