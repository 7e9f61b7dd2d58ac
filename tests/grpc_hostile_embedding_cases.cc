// EmbeddingService's hostile cases (tests/grpc_hostile_cases.h).
#include <cstdint>
#include <string>

#include "common/quote.h"
#include "proto/embedding.pb.h"
#include "tests/grpc_hostile_cases.h"

namespace pstrain {

namespace {

// The training calls.
void AddEmbeddingCallCases(const CaseAdder& add) {
  {
    InitEmbeddingsRequest r;
    r.set_job("job");
    r.set_attempt(3);
    r.set_num_workers(1);
    r.set_consistency(ASYNC);
    r.set_num_shards(1);
    add("InitEmbeddings", "no tables", r, grpc::StatusCode::INVALID_ARGUMENT);
    EmbeddingTableConfig* t = r.add_tables();
    t->set_name("t");
    t->set_dim(100000);
    t->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
    t->mutable_optimizer()->set_lr(1);
    add("InitEmbeddings", "dim 100000", r, grpc::StatusCode::INVALID_ARGUMENT);
    t->set_dim(2);
    r.set_shard_index(1);
    add("InitEmbeddings", "shard past the count", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_shard_index(0);
    r.set_attempt(1);
    add("InitEmbeddings", "earlier attempt", r, grpc::StatusCode::ABORTED);
  }
  {
    EmbeddingLookupRequest r;
    r.set_job("nope");
    add("Lookup", "unknown job", r, grpc::StatusCode::FAILED_PRECONDITION);
    r.set_job("job");
    r.set_attempt(1);
    add("Lookup", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(2);
    r.set_rank(99);
    add("Lookup", "rank out of range", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_rank(0);
    EmbeddingIds* ids = r.add_tables();
    ids->set_table("t");
    ids->set_ids(std::string(7, '\0'));
    add("Lookup", "ids not whole int64", r, grpc::StatusCode::INVALID_ARGUMENT);
    ids->set_table("other");
    ids->set_ids(std::string(8, '\0'));
    add("Lookup", "unknown table", r, grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    EmbeddingUpdateRequest r;
    r.set_job("job");
    r.set_attempt(2);
    r.set_step(-1);
    add("Update", "negative step", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_step(0);
    EmbeddingIds* ids = r.add_tables();
    ids->set_table("t");
    ids->set_ids(std::string(8, '\0'));
    r.add_grads(std::string(4, '\0'));  // one float of the row's two
    add("Update", "gradient of the wrong dim", r, grpc::StatusCode::INVALID_ARGUMENT);
  }
}

// The coordinator's calls and the shards' forwards.
void AddEmbeddingAdminCases(const CaseAdder& add) {
  {
    DropEmbeddingsRequest r;
    r.set_job("job");
    r.set_attempt(1);
    add("DropEmbeddings", "earlier attempt", r, grpc::StatusCode::ABORTED);
  }
  {
    EmbeddingStatsRequest r;
    r.set_job("nope");
    add("Stats", "unknown job", r, grpc::StatusCode::NOT_FOUND);
  }
  {
    SaveEmbeddingsRequest r;
    r.set_job("job");
    r.set_attempt(2);
    for (const std::string& path : {std::string("../escape"), std::string("/etc/passwd"), std::string("")}) {
      r.set_path(path);
      add("SaveEmbeddings", "path " + Quote(path), r, grpc::StatusCode::INVALID_ARGUMENT);
    }
    r.set_path("other-job/x.emb");
    add("SaveEmbeddings", "another job's directory", r, grpc::StatusCode::PERMISSION_DENIED);
    r.set_path("job/x.emb");
    r.set_attempt(1);
    add("SaveEmbeddings", "earlier attempt", r, grpc::StatusCode::ABORTED);
  }
  {
    ReplicateEmbeddingsRequest r;
    r.set_job("nope");
    add("ReplicateEmbeddings", "unknown job", r, grpc::StatusCode::FAILED_PRECONDITION);
    r.set_job("job");
    r.set_attempt(1);
    add("ReplicateEmbeddings", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(2);
    r.set_slot(7);
    add("ReplicateEmbeddings", "a slot the shard does not hold", r, grpc::StatusCode::FAILED_PRECONDITION);
    r.set_slot(0);
    add("ReplicateEmbeddings", "a job that is not replicated", r, grpc::StatusCode::FAILED_PRECONDITION);
    InitEmbeddingsRequest* copy = r.mutable_copy_init();
    copy->set_job("other");
    copy->set_attempt(2);
    add("ReplicateEmbeddings", "a copy of another job's tables", r, grpc::StatusCode::INVALID_ARGUMENT);
    copy->set_job("job");
    copy->set_num_workers(1);
    copy->set_replicas(1);
    copy->set_num_shards(2);
    r.mutable_copy_state()->add_claimed(0);  // one rank's claimed step, and no applied
    add("ReplicateEmbeddings", "a copy whose state does not match its ranks", r, grpc::StatusCode::INVALID_ARGUMENT);
    InitEmbeddingsRequest i;
    i.set_job("job");
    i.set_attempt(3);
    i.set_num_workers(1);
    i.set_consistency(ASYNC);
    i.set_num_shards(2);
    i.set_replicas(1);
    EmbeddingTableConfig* t = i.add_tables();
    t->set_name("t");
    t->set_dim(2);
    t->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
    t->mutable_optimizer()->set_lr(1);
    i.mutable_routing()->add_targets("127.0.0.1:1");
    i.mutable_routing()->add_targets(std::string(300, 'h'));
    add("InitEmbeddings", "a 300-byte routing target", i, grpc::StatusCode::INVALID_ARGUMENT);
    i.set_replicas(2);
    add("InitEmbeddings", "as many replicas as shards", i, grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    LoadEmbeddingsRequest r;
    r.mutable_init()->set_job("job");
    add("LoadEmbeddings", "no tables", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.add_paths("../escape");
    add("LoadEmbeddings", "path ../escape", r, grpc::StatusCode::INVALID_ARGUMENT);
    for (int i = 0; i < 4100; ++i) r.add_paths("job/x.emb");
    add("LoadEmbeddings", "4101 files", r, grpc::StatusCode::INVALID_ARGUMENT);
  }
}

}  // namespace

void AddEmbeddingCases(const CaseAdder& add) {
  AddEmbeddingCallCases(add);
  AddEmbeddingAdminCases(add);
}

}  // namespace pstrain
