#include "rpc/grpc_remote_shard.h"

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/status_util.h"
#include "spdlog/spdlog.h"

namespace pstrain {

struct GrpcRemoteShard::Call {
  std::string method;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientContext> context;
  google::protobuf::MessageLite* response_header = nullptr;
  std::vector<TensorBuffer>* response_tensors = nullptr;
  std::vector<TensorBuffer> destinations;  // caller-provided output buffers
  absl::Time deadline;
  std::string job_secret;
  std::string table_grant;
  int attempt = 0;
  absl::Duration backoff;
  uint64_t epoch = 0;  // GrpcRemoteShard::cancel_epoch_ when it started
  StatusCallback done;
};

GrpcRemoteShard::GrpcRemoteShard(RemoteShardOptions options)
    : options_(std::move(options)),
      channel_(CreateChannel(options_.target, options_.max_message_bytes)),
      stub_(std::make_unique<grpc::GenericStub>(channel_)),
      retry_timer_(std::make_unique<RetryTimer>()) {}

GrpcRemoteShard::~GrpcRemoteShard() {
  // A call's `done` may have returned (and its caller destroyed this client)
  // while the gRPC thread that ran it has yet to count it out: wait for that
  // last decrement, or it lands in freed memory (it did: a test's client on
  // the stack, and a segfault in the next frame that used that stack).
  while (in_flight_.load() > 0) std::this_thread::yield();
}

void GrpcRemoteShard::StartAsync(const std::string& method, const google::protobuf::MessageLite& header,
                                 const std::vector<TensorBuffer>& tensors,
                                 google::protobuf::MessageLite* response,
                                 std::vector<TensorBuffer>* response_tensors,
                                 const CallOptions& options, StatusCallback done) {
  ++in_flight_;  // counted out by Finish, after `done` returns
  auto call = std::make_shared<Call>();
  call->method = absl::StrCat("/pstrain.ParameterService/", method);
  call->done = std::move(done);
  absl::Status encoded = EncodeTensorMessage(header, tensors, &call->request);
  if (!encoded.ok()) {
    Finish(call, encoded);
    return;
  }
  call->response_header = response;
  call->response_tensors = response_tensors;
  if (response_tensors != nullptr) call->destinations = *response_tensors;
  call->deadline = options.deadline == absl::InfiniteFuture()
                       ? absl::Now() + options_.default_timeout
                       : options.deadline;
  call->backoff = options_.initial_backoff;
  call->job_secret = options.job_secret;
  call->table_grant = options.table_grant;
  {
    absl::MutexLock lock(&live_mu_);
    call->epoch = cancel_epoch_;
  }
  AttemptAsync(std::move(call));
}

void GrpcRemoteShard::CancelCalls() {
  absl::MutexLock lock(&live_mu_);
  ++cancel_epoch_;
  // Each context is alive while its call is in live_ (the callback takes
  // it out first); TryCancel does not block.
  for (Call* call : live_) call->context->TryCancel();
}

void GrpcRemoteShard::AttemptAsync(std::shared_ptr<Call> call) {
  ++call->attempt;
  call->context = std::make_unique<grpc::ClientContext>();
  call->context->set_deadline(absl::ToChronoTime(call->deadline));
  if (!call->job_secret.empty()) call->context->AddMetadata(kJobSecretMetadata, call->job_secret);
  if (!call->table_grant.empty()) call->context->AddMetadata(kTableGrantMetadata, call->table_grant);
  call->response.Clear();
  bool cancelled = false;
  {
    absl::MutexLock lock(&live_mu_);
    cancelled = call->epoch != cancel_epoch_;
    // A TryCancel before the call starts cancels it when it starts.
    if (!cancelled) live_.insert(call.get());
  }
  if (cancelled) {
    Finish(call, absl::CancelledError(
                     absl::StrCat(call->method, " on ", options_.target, ": cancelled (the shard was declared lost)")));
    return;
  }
  // The request ByteBuffer is kept for retries: copying it copies slice
  // references, not bytes.
  stub_->UnaryCall(
      call->context.get(), call->method, grpc::StubOptions(), &call->request, &call->response,
      [this, call](grpc::Status status) {
        {
          absl::MutexLock lock(&live_mu_);
          live_.erase(call.get());
        }
        const bool unavailable = status.error_code() == grpc::StatusCode::UNAVAILABLE;
        if (unavailable && call->attempt < options_.max_attempts && absl::Now() + call->backoff < call->deadline) {
          absl::Time when = absl::Now() + call->backoff;
          call->backoff = std::min(call->backoff * 2, options_.max_backoff);
          spdlog::warn("{} on {} unavailable ({}); retry {} of {} in {}", call->method,
                       options_.target, status.error_message(), call->attempt,
                       options_.max_attempts - 1, absl::FormatDuration(when - absl::Now()));
          retry_timer_->RunAt(when, [this, call](bool ok) {
            if (ok) {
              AttemptAsync(call);
            } else {
              Finish(call, absl::CancelledError("client shut down while waiting to retry"));
            }
          });
          return;
        }
        // At debug level, how retries ended: the caller hears only the
        // last attempt's status, not whether it was retried or why not.
        if (unavailable) {
          spdlog::debug("{} on {}: unavailable on attempt {} of {}, not retried: {}", call->method, options_.target,
                        call->attempt, options_.max_attempts,
                        call->attempt >= options_.max_attempts
                            ? std::string("attempts used up")
                            : absl::StrCat("the deadline is ", absl::FormatDuration(call->deadline - absl::Now()),
                                           " away, the next wait ", absl::FormatDuration(call->backoff)));
        } else if (call->attempt > 1) {
          spdlog::debug("{} on {}: attempt {} of {} ended {}", call->method, options_.target, call->attempt,
                        options_.max_attempts, absl::StatusCodeToString(FromGrpcStatus(status).code()));
        }
        if (!status.ok()) {
          absl::Status s = FromGrpcStatus(status);
          Finish(call, absl::Status(
              s.code(), absl::StrCat(call->method, " on ", options_.target, ": ", s.message())));
          return;
        }
        std::vector<TensorBuffer> scratch;
        absl::Status decoded = DecodeTensorMessage(
            call->response, call->response_header,
            call->response_tensors != nullptr ? call->response_tensors : &scratch,
            call->destinations.empty() ? nullptr : &call->destinations);
        Finish(call, decoded);
      });
}

void GrpcRemoteShard::Finish(const std::shared_ptr<Call>& call, absl::Status status) {
  call->done(std::move(status));
  // Nothing of `this` is touched after this: at zero RemoteShardCache may
  // destroy the client (the gRPC thread that runs us only unwinds; the
  // ClientContext in `call` holds its own reference to the channel).
  --in_flight_;
}

void GrpcRemoteShard::InitTableAsync(const InitTableRequest& request, std::vector<TensorBuffer> values,
                                     InitTableResponse* response, const CallOptions& options,
                                     StatusCallback done) {
  StartAsync("InitTable", request, values, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::ReplicateAsync(const ReplicateRequest& request, std::vector<TensorBuffer> tensors,
                                     ReplicateResponse* response, const CallOptions& options, StatusCallback done) {
  StartAsync("Replicate", request, tensors, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::PullAsync(const PullRequest& request, PullResponse* response,
                                std::vector<TensorBuffer>* values, const CallOptions& options,
                                StatusCallback done) {
  StartAsync("Pull", request, {}, response, values, options, std::move(done));
}

void GrpcRemoteShard::PushAsync(const PushRequest& request, std::vector<TensorBuffer> grads,
                                PushResponse* response, const CallOptions& options,
                                StatusCallback done) {
  StartAsync("Push", request, grads, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::PushPullAsync(const PushPullRequest& request, std::vector<TensorBuffer> grads,
                                    PushPullResponse* response, std::vector<TensorBuffer>* values,
                                    const CallOptions& options, StatusCallback done) {
  StartAsync("PushPull", request, grads, response, values, options, std::move(done));
}

void GrpcRemoteShard::StatsAsync(const StatsRequest& request, StatsResponse* response,
                                 const CallOptions& options, StatusCallback done) {
  StartAsync("Stats", request, {}, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::SaveTableAsync(const SaveTableRequest& request, SaveTableResponse* response,
                                     const CallOptions& options, StatusCallback done) {
  StartAsync("SaveTable", request, {}, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::LoadTableAsync(const LoadTableRequest& request, LoadTableResponse* response,
                                     const CallOptions& options, StatusCallback done) {
  StartAsync("LoadTable", request, {}, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::DropTableAsync(const DropTableRequest& request, DropTableResponse* response,
                                     const CallOptions& options, StatusCallback done) {
  StartAsync("DropTable", request, {}, response, nullptr, options, std::move(done));
}

void GrpcRemoteShard::SetWorkersAsync(const SetWorkersRequest& request, SetWorkersResponse* response,
                                      const CallOptions& options, StatusCallback done) {
  StartAsync("SetWorkers", request, {}, response, nullptr, options, std::move(done));
}

std::shared_ptr<GrpcRemoteShard> RemoteShardCache::Get(const RemoteShardOptions& options) {
  const std::string key = absl::StrCat(options.target, "|", absl::FormatDuration(options.default_timeout), "|",
                                       options.max_attempts, "|", options.max_message_bytes);
  // Destroyed after the lock is released: a client's destructor joins its
  // retry thread and releases its channel.
  std::vector<std::shared_ptr<GrpcRemoteShard>> evicted;
  std::shared_ptr<GrpcRemoteShard> found;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.now();
    for (auto it = clients_.begin(); it != clients_.end();) {
      Entry& e = it->second;
      if (!Idle(e)) {
        // In use now counts as used now: the idle time starts when the last
        // holder lets go (as seen by a lookup).
        e.last_used = now;
      } else if (now - e.last_used > options_.idle_timeout && it->first != key) {
        evicted.push_back(std::move(e.client));
        it = clients_.erase(it);
        continue;
      }
      ++it;
    }
    auto it = clients_.find(key);
    if (it == clients_.end()) {
      if (clients_.size() >= options_.max_clients) {
        auto lru = clients_.end();
        for (auto c = clients_.begin(); c != clients_.end(); ++c) {
          if (Idle(c->second) && (lru == clients_.end() || c->second.last_used < lru->second.last_used)) lru = c;
        }
        if (lru != clients_.end()) {
          evicted.push_back(std::move(lru->second.client));
          clients_.erase(lru);
        } else {
          spdlog::warn("{} shard clients, all in use (the bound is {}): adding one for {}", clients_.size(),
                       options_.max_clients, options.target);
        }
      }
      it = clients_.emplace(key, Entry{std::make_shared<GrpcRemoteShard>(options), now}).first;
    }
    it->second.last_used = now;
    found = it->second.client;
  }
  return found;
}

size_t RemoteShardCache::size() const {
  absl::MutexLock lock(&mu_);
  return clients_.size();
}

std::shared_ptr<GrpcRemoteShard> SharedRemoteShard(const RemoteShardOptions& options) {
  static auto* cache = new RemoteShardCache();
  return cache->Get(options);
}

}  // namespace pstrain
