#include "server/ps/grpc_parameter_service.h"

#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/quote.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/security.h"
#include "rpc/status_util.h"
#include "server/ps/job_paths.h"
#include "rpc/table_grant.h"

namespace pstrain {
namespace {

CallOptions OptionsFrom(const grpc::CallbackServerContext* context) {
  CallOptions options;
  const auto deadline = context->deadline();
  // gRPC reports "no deadline" as the far future; keep that infinite.
  if (deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 10)) {
    options.deadline = absl::FromChrono(deadline);
  }
  return options;
}

// Request, response and tensors of one call. Shared with the store's
// callback, which may run after the client has gone (at the latest at the
// call's deadline); gRPC keeps `response` valid until Finish().
template <typename Request, typename Response>
struct CallState {
  Request request;
  std::vector<TensorBuffer> in_tensors;
  Response response;
  std::vector<TensorBuffer> out_tensors;
};

// Metadata value `key` of the call (empty if none).
std::string MetadataOf(const grpc::CallbackServerContext* context, const char* key) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// The job secret the caller sent (empty if none).
std::string PresentedSecret(const grpc::CallbackServerContext* context) {
  return MetadataOf(context, kJobSecretMetadata);
}

// What a call does with the job's secret: checks it, and after success
// records it (a table made) or forgets it (the table dropped; not if a
// table-making call overlapped the drop).
enum class SecretUse { kCheck, kRecord, kForget };

// No admission check besides the job secret.
template <typename Request>
absl::Status Anyone(const Request&) {
  return absl::OkStatus();
}

// Decodes the request, asks `admit(request)` whether the caller may make
// it, checks the job secret, runs `invoke(state, done)` and finishes the
// call with the encoded response or the error.
template <typename Request, typename Response, typename Admit, typename Invoke>
grpc::ServerUnaryReactor* Serve(const char* method, ParameterServiceMetrics* metrics, JobSecrets* secrets,
                                SecretUse use, grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer* request, grpc::ByteBuffer* response, Admit admit,
                                Invoke invoke) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  const size_t bytes_in = request->Length();
  auto finish = [=](const absl::Status& s) {
    if (metrics != nullptr) {
      metrics->Record(method, absl::StatusCodeToString(s.code()), bytes_in, s.ok() ? response->Length() : 0,
                      absl::ToDoubleSeconds(absl::Now() - start));
    }
    reactor->Finish(ToGrpcStatus(s));
  };
  auto state = std::make_shared<CallState<Request, Response>>();
  // A push's gradients are read once, by the optimizer, which takes them in
  // the pieces they arrived in: no copy into one buffer first.
  DecodeOptions decode;
  decode.pieces = std::is_same_v<Request, PushRequest> || std::is_same_v<Request, PushPullRequest> ||
                  std::is_same_v<Request, ReplicateRequest>;
  absl::Status decoded = DecodeTensorMessage(*request, &state->request, &state->in_tensors, decode);
  if (!decoded.ok()) {
    finish(decoded);
    return reactor;
  }
  if (absl::Status admitted = admit(state->request); !admitted.ok()) {
    finish(admitted);
    return reactor;
  }
  std::string secret = PresentedSecret(context);
  const std::string& job = state->request.job();
  if (!job.empty()) {
    absl::Status allowed = secrets->Check(job, secret);
    if (!allowed.ok()) {
      finish(allowed);
      return reactor;
    }
  }
  // A table change is bracketed in `secrets` (see JobSecrets), so a drop
  // seen after a next attempt's InitTable does not forget the new table's
  // secret.
  JobSecrets::DropTicket ticket;
  if (use == SecretUse::kRecord) secrets->BeginMake(job);
  if (use == SecretUse::kForget) ticket = secrets->BeginDrop(job);
  invoke(state, OptionsFrom(context),
         [state, response, finish, secrets, use, ticket, secret = std::move(secret)](absl::Status s) {
           if (use == SecretUse::kRecord) secrets->EndMake(state->request.job(), s.ok(), secret);
           if (use == SecretUse::kForget) secrets->EndDrop(state->request.job(), ticket, s.ok());
           if (s.ok()) s = EncodeTensorMessage(state->response, state->out_tensors, response);
           finish(s);
         });
  return reactor;
}

// Serve's `invoke` for a store call that carries no tensors either way: the
// request in, the response out.
template <typename Request, typename Response>
auto StoreCall(ParameterStore* store,
               void (ParameterStore::*call)(const Request&, Response*, const CallOptions&, StatusCallback)) {
  return [store, call](auto state, const CallOptions& options, auto done) {
    (store->*call)(state->request, &state->response, options, std::move(done));
  };
}

}  // namespace

absl::Status GrpcParameterService::CoordinatorOnly(const grpc::CallbackServerContext* context,
                                                   const char* method) const {
  const Caller caller = CallerOf(*context, options_.tokens.get());
  if (caller.IsCoordinator()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(method, " is the coordinator's to call, and this is a ",
                                                  CallerRoleName(caller.role),
                                                  " token (it takes one of group pstrain:coordinator)"));
}

absl::Status GrpcParameterService::Granted(const grpc::CallbackServerContext* context, const std::string& job,
                                           uint64_t attempt, const char* method) const {
  if (options_.grants == nullptr) return absl::OkStatus();
  const std::string grant = MetadataOf(context, kTableGrantMetadata);
  if (options_.grants->Valid(job, attempt, PresentedSecret(context), grant)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      method, " of job ", Quote(job, 64), " attempt ", attempt, ": ",
      grant.empty() ? "the call carries no table grant" : "the table grant is not the coordinator's for this job, "
                                                          "attempt and secret",
      " (this shard makes a table only with the grant its coordinator gives the job's workers; is this "
      "shard's --table_grant_public_key_file the public key of the coordinator's --table_grant_key_file?)"));
}

grpc::ServerUnaryReactor* GrpcParameterService::InitTable(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Serve<InitTableRequest, InitTableResponse>(
      "InitTable", metrics_, &secrets_, SecretUse::kRecord, context, request, response,
      [this, context](const InitTableRequest& r) { return Granted(context, r.job(), r.attempt(), "InitTable"); },
      [this](auto state, const CallOptions& options, auto done) {
        store_->InitTableAsync(state->request, std::move(state->in_tensors), &state->response, options,
                               std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcParameterService::Pull(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return Serve<PullRequest, PullResponse>(
      "Pull", metrics_, &secrets_, SecretUse::kCheck, context, request, response,
      Anyone<PullRequest>,
      [this](auto state, const CallOptions& options, auto done) {
        store_->PullAsync(state->request, &state->response, &state->out_tensors, options,
                          std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcParameterService::Push(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return Serve<PushRequest, PushResponse>(
      "Push", metrics_, &secrets_, SecretUse::kCheck, context, request, response,
      Anyone<PushRequest>,
      [this](auto state, const CallOptions& options, auto done) {
        store_->PushAsync(state->request, std::move(state->in_tensors), &state->response, options,
                          std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcParameterService::PushPull(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Serve<PushPullRequest, PushPullResponse>(
      "PushPull", metrics_, &secrets_, SecretUse::kCheck, context, request, response,
      Anyone<PushPullRequest>,
      [this](auto state, const CallOptions& options, auto done) {
        store_->PushPullAsync(state->request, std::move(state->in_tensors), &state->response,
                              &state->out_tensors, options, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcParameterService::Replicate(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  // Shard tokens only (rpc/security.cc's access rule), with the job's secret.
  return Serve<ReplicateRequest, ReplicateResponse>(
      "Replicate", metrics_, &secrets_, SecretUse::kCheck, context, request, response, Anyone<ReplicateRequest>,
      [this](auto state, const CallOptions& options, auto done) {
        store_->ReplicateAsync(state->request, std::move(state->in_tensors), &state->response, options,
                               std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcParameterService::Stats(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return Serve<StatsRequest, StatsResponse>(
      "Stats", metrics_, &secrets_, SecretUse::kCheck, context, request, response,
      [this, context](const StatsRequest& r) {
        // Every table's name and config: the coordinator's view only.
        return r.job().empty() ? CoordinatorOnly(context, "Stats of every table") : absl::OkStatus();
      },
      StoreCall(store_, &ParameterStore::StatsAsync));
}

grpc::ServerUnaryReactor* GrpcParameterService::SaveTable(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Serve<SaveTableRequest, SaveTableResponse>(
      "SaveTable", metrics_, &secrets_, SecretUse::kCheck, context, request, response,
      [this, context](const SaveTableRequest& r) {
        absl::Status s = CoordinatorOnly(context, "SaveTable");
        if (s.ok() && !InJobDirectory(r.path(), r.job())) {
          s = absl::PermissionDeniedError(absl::StrCat("SaveTable of job ", Quote(r.job(), 64), ": ",
                                                       Quote(r.path(), 128), " is not in a directory named after "
                                                       "the job (its <output_dir>/<job>/)"));
        }
        return s;
      },
      StoreCall(store_, &ParameterStore::SaveTableAsync));
}

grpc::ServerUnaryReactor* GrpcParameterService::LoadTable(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Serve<LoadTableRequest, LoadTableResponse>(
      "LoadTable", metrics_, &secrets_, SecretUse::kRecord, context, request, response,
      [this, context](const LoadTableRequest& r) {
        absl::Status s = CoordinatorOnly(context, "LoadTable");
        return s.ok() ? Granted(context, r.job(), r.attempt(), "LoadTable") : s;
      },
      StoreCall(store_, &ParameterStore::LoadTableAsync));
}

grpc::ServerUnaryReactor* GrpcParameterService::DropTable(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Serve<DropTableRequest, DropTableResponse>(
      "DropTable", metrics_, &secrets_, SecretUse::kForget, context, request, response,
      [this, context](const DropTableRequest&) { return CoordinatorOnly(context, "DropTable"); },
      StoreCall(store_, &ParameterStore::DropTableAsync));
}

grpc::ServerUnaryReactor* GrpcParameterService::SetWorkers(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return Serve<SetWorkersRequest, SetWorkersResponse>(
      "SetWorkers", metrics_, &secrets_, SecretUse::kCheck, context, request, response,
      [this, context](const SetWorkersRequest&) { return CoordinatorOnly(context, "SetWorkers"); },
      [this, context](auto state, const CallOptions& options, StatusCallback done) {
        store_->SetWorkersAsync(state->request, &state->response, options,
                                [this, state, secret = PresentedSecret(context), done = std::move(done)](absl::Status s) {
                                  if (options_.on_set_workers) s = options_.on_set_workers(state->request, secret, s);
                                  done(std::move(s));
                                });
      });
}

}  // namespace pstrain
