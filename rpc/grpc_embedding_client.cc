#include "rpc/grpc_embedding_client.h"

#include <grpcpp/grpcpp.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fan_out.h"
#include "embedding/row_math.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/status_util.h"

namespace pstrain {
namespace {

// A call's outcome, named by its shard.
absl::Status OfShard(size_t shard, const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status a = FromGrpcStatus(s);
  return absl::Status(a.code(), absl::StrCat("embedding shard ", shard, ": ", a.message()));
}

}  // namespace

GrpcEmbeddingClient::GrpcEmbeddingClient(std::vector<std::shared_ptr<grpc::Channel>> shards,
                                         EmbeddingClientOptions options)
    : options_(std::move(options)) {
  for (auto& channel : shards) stubs_.push_back(EmbeddingService::NewStub(channel));
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

namespace {

// A lookup's or update's fields for one shard: who asks, for which step,
// and the ids of each table that go to that shard.
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
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  std::vector<size_t> asked;
  for (size_t s = 0; s < n; ++s) {
    bool any = false;
    for (const auto& p : at[s]) any = any || !p.empty();
    if (any) asked.push_back(s);  // a shard with none of the batch's ids is not asked
  }
  FanOut calls;
  for (size_t s : asked) {
    EmbeddingLookupRequest& r = requests[s];
    Fill(options_, step, tables_, ids, at[s], &r);
    r.set_read_only(kind == EmbeddingLookupKind::kReadOnly);
    contexts[s] = Context();
    calls.Add();
    stubs_[s]->async()->Lookup(contexts[s].get(), &r, &responses[s],
                               [&calls, s](grpc::Status st) { calls.Done(OfShard(s, st)); });
  }
  if (absl::Status e = calls.Wait(); !e.ok()) return e;
  for (size_t s : asked) {
    if (responses[s].values_size() != static_cast<int>(ids.size())) {
      return absl::InternalError(
          absl::StrCat("embedding shard ", s, " answered ", responses[s].values_size(), " tables for ", ids.size()));
    }
    for (size_t t = 0; t < ids.size(); ++t) {
      const size_t row_bytes = tables_[t].dim() * sizeof(float);
      const std::string& v = responses[s].values(static_cast<int>(t));
      if (v.size() != at[s][t].size() * row_bytes) {
        return absl::InternalError(absl::StrCat("embedding shard ", s, " answered ", v.size(), " bytes for table '",
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
                                         const std::vector<const float*>& grads) {
  if (ids.size() != tables_.size() || grads.size() != tables_.size()) {
    return absl::InvalidArgumentError("one id list and one gradient block per embedding table");
  }
  const auto at = Route(ids);
  const size_t n = stubs_.size();
  std::vector<EmbeddingUpdateRequest> requests(n);
  std::vector<EmbeddingUpdateResponse> responses(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  FanOut calls;
  for (size_t s = 0; s < n; ++s) {
    EmbeddingUpdateRequest& r = requests[s];
    Fill(options_, step, tables_, ids, at[s], &r);
    for (size_t t = 0; t < ids.size(); ++t) {
      const size_t row_bytes = tables_[t].dim() * sizeof(float);
      std::string* g = r.add_grads();
      g->resize(at[s][t].size() * row_bytes);
      for (size_t k = 0; k < at[s][t].size(); ++k) {
        std::memcpy(g->data() + k * row_bytes, grads[t] + static_cast<size_t>(at[s][t][k]) * tables_[t].dim(),
                    row_bytes);
      }
    }
    contexts[s] = Context();
    calls.Add();
    stubs_[s]->async()->Update(contexts[s].get(), &r, &responses[s],
                               [&calls, s](grpc::Status st) { calls.Done(OfShard(s, st)); });
  }
  return calls.Wait();
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

void SaveEmbeddingsAsync(const std::shared_ptr<grpc::Channel>& shard, const SaveEmbeddingsRequest& request,
                         const std::string& job_secret, absl::Time deadline, SaveEmbeddingsResponse* response,
                         std::function<void(absl::Status)> done) {
  // What must outlive the call, freed by its callback.
  struct Call {
    grpc::ClientContext context;
    SaveEmbeddingsRequest request;
    std::unique_ptr<EmbeddingService::Stub> stub;
  };
  auto* call = new Call;
  call->context.set_deadline(absl::ToChronoTime(deadline));
  if (!job_secret.empty()) call->context.AddMetadata(kJobSecretMetadata, job_secret);
  call->request = request;
  call->stub = EmbeddingService::NewStub(shard);
  call->stub->async()->SaveEmbeddings(&call->context, &call->request, response,
                                      [call, done = std::move(done)](grpc::Status s) {
                                        delete call;
                                        done(FromGrpcStatus(s));
                                      });
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

}  // namespace pstrain
