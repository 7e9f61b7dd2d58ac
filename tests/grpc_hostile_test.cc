// Every RPC of every pstrain service, called as a hostile or buggy client
// would, over real gRPC on 127.0.0.1 (in-process servers):
//   - bytes that are not the request message,
//   - every string field of the request 1 MiB long, and not UTF-8,
//   - the method's own hostile cases (the table below),
// each answered with a fitting code and a message a person can read
// (non-empty, bounded: client strings are quoted as prefixes), and the
// server still SERVING afterwards. The table must name every method of the
// services' descriptors: a new RPC cannot be added without its cases.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "google/protobuf/descriptor.h"
#include "proto/control.pb.h"
#include "proto/parameter.pb.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_server.h"
#include "rpc/health_check.h"
#include "rpc/status_util.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "server/ps/grpc_parameter_service.h"
#include "tests/grpc_hostile_cases.h"
#include "tests/in_process_services.h"
#include "tests/raw_call.h"
#include "table/shard_store.h"

namespace pstrain {
namespace {

// `message` with every string field (top level) set to `value`; empty when
// it has none.
std::string WithStrings(google::protobuf::Message* message, const std::string& value) {
  const google::protobuf::Descriptor* d = message->GetDescriptor();
  const google::protobuf::Reflection* r = message->GetReflection();
  bool any = false;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_STRING) continue;
    any = true;
    if (f->is_repeated()) {
      r->AddString(message, f, value);
    } else {
      r->SetString(message, f, value);
    }
  }
  return any ? message->SerializeAsString() : std::string();
}

// ParameterService: the training calls. The cases are sent with a table
// "job" of attempt 2 and one worker in place (made by the test first).
void AddParameterCallCases(const CaseAdder& add) {
  {
    InitTableRequest r;
    r.set_job("job");
    r.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    r.mutable_config()->mutable_optimizer()->set_lr(1);
    r.mutable_config()->set_consistency(ASYNC);
    r.mutable_config()->set_num_workers(65536);
    add("InitTable", "65536 workers", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.mutable_config()->set_num_workers(1);
    r.mutable_config()->mutable_optimizer()->set_lr(1e300);
    add("InitTable", "absurd lr", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.mutable_config()->mutable_optimizer()->set_lr(1);
    r.set_attempt(1);  // the table "job" holds attempt 2
    add("InitTable", "earlier attempt", r, grpc::StatusCode::ABORTED);
    // A pipelined table's request: a huge layout, a stage past the table's.
    InitTableRequest piped;
    piped.set_job("piped");
    *piped.mutable_config() = r.config();
    piped.mutable_config()->set_num_workers(2);
    piped.mutable_config()->set_pipeline_stages(2);
    piped.add_keys("k");
    KeyLayout* huge = piped.add_layouts();
    huge->set_dtype(DT_FLOAT32);
    huge->add_shape(int64_t{1} << 40);
    huge->add_shape(int64_t{1} << 40);
    add("InitTable", "a pipelined key of 2^80 elements", piped, grpc::StatusCode::INVALID_ARGUMENT);
    piped.mutable_layouts(0)->set_shape(0, 1 << 30);
    piped.mutable_layouts(0)->set_shape(1, 1 << 10);
    add("InitTable", "a pipelined key over the shard's memory", piped, grpc::StatusCode::RESOURCE_EXHAUSTED);
    piped.set_stage(7);
    add("InitTable", "a stage past the table's", piped, grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    PullRequest r;
    r.set_job("nope");
    add("Pull", "unknown job", r, grpc::StatusCode::FAILED_PRECONDITION);
    r.set_job("job");
    r.set_attempt(1);
    add("Pull", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(2);
    r.set_min_version(INT64_MAX);
    add("Pull", "unreachable version", r, grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    PushRequest r;
    r.set_job("job");
    r.set_attempt(1);
    add("Push", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(2);
    r.set_step(INT64_MAX);
    add("Push", "step near INT64_MAX", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_step(0);
    r.set_worker(99);
    add("Push", "worker out of range", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_worker(0);
    r.set_generation(7);
    add("Push", "holder not admitted yet", r, grpc::StatusCode::UNAVAILABLE);
  }
  {
    PushPullRequest r;
    r.set_job("job");
    r.set_attempt(0);
    add("PushPull", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(3);
    add("PushPull", "later attempt", r, grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    StatsRequest r;
    r.set_job("nope");
    add("Stats", "unknown job", r, grpc::StatusCode::NOT_FOUND);
  }
}

// ParameterService: checkpoints, dropping a table and the job's seats.
void AddParameterAdminCases(const CaseAdder& add) {
  {
    SaveTableRequest r;
    r.set_job("job");
    r.set_attempt(2);
    for (const std::string& path : {std::string("../escape"), std::string("/etc/passwd"),
                                    std::string("a\0b", 3), std::string("")}) {
      r.set_path(path);
      add("SaveTable", "path " + Quote(path), r, grpc::StatusCode::INVALID_ARGUMENT);
    }
    r.set_path("job/ok.bin");  // in the job's directory: what stops it is the attempt
    r.set_attempt(1);
    add("SaveTable", "earlier attempt", r, grpc::StatusCode::ABORTED);
  }
  {
    LoadTableRequest r;
    r.set_job("other");
    *r.mutable_config() = TableConfig();
    r.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    r.mutable_config()->mutable_optimizer()->set_lr(1);
    r.mutable_config()->set_consistency(ASYNC);
    r.mutable_config()->set_num_workers(1);
    r.add_keys("a");
    auto* f = r.add_files();
    f->set_bytes(100);
    for (const std::string& path : {std::string("/dev/zero"), std::string("../../x")}) {
      f->set_path(path);
      add("LoadTable", "file " + path, r, grpc::StatusCode::INVALID_ARGUMENT);
    }
    f->set_path("missing.bin");
    add("LoadTable", "missing file", r, grpc::StatusCode::DATA_LOSS);
  }
  {
    DropTableRequest r;
    r.set_job("job");
    r.set_attempt(1);
    add("DropTable", "late drop of an earlier attempt", r, grpc::StatusCode::ABORTED);
  }
  {
    SetWorkersRequest r;
    r.set_job("nope");
    add("SetWorkers", "unknown job", r, grpc::StatusCode::FAILED_PRECONDITION);
    r.set_job("job");
    r.set_attempt(1);
    add("SetWorkers", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(2);
    for (int i = 0; i < 100000; ++i) r.add_seats()->set_active(true);
    add("SetWorkers", "100000 seats for a 1-worker table", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.clear_seats();
    r.mutable_routing()->set_generation(7);
    add("SetWorkers", "a routing for a table that is not replicated", r, grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    // A primary's forward (docs/replication.md): only to a replicated table
    // of the same attempt.
    ReplicateRequest r;
    r.set_job("nope");
    add("Replicate", "unknown job", r, grpc::StatusCode::FAILED_PRECONDITION);
    r.set_job("job");
    r.set_attempt(1);
    add("Replicate", "earlier attempt", r, grpc::StatusCode::ABORTED);
    r.set_attempt(2);
    r.set_generation(1);
    r.add_chunks()->set_key(std::string(100000, 'k'));
    add("Replicate", "a table that is not replicated", r, grpc::StatusCode::FAILED_PRECONDITION);
  }
}

void AddJobServiceCases(const CaseAdder& add) {
  {
    SubmitJobRequest r;
    r.set_spec_yaml("workers: [unclosed");
    add("SubmitJob", "bad YAML", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_spec_yaml("{? [a, b]: c}");
    add("SubmitJob", "non-scalar key", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_spec_yaml("workers: 1\n");
    r.set_output_dir("/etc");
    add("SubmitJob", "output_dir outside the root", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_output_dir("");
    r.set_resume_from("/proc/self");
    add("SubmitJob", "resume_from outside the root", r, grpc::StatusCode::INVALID_ARGUMENT);
  }
  for (const char* m : {"GetJob", "WatchJob", "CancelJob", "Checkpoint", "ScaleJob"}) {
    GetJobRequest r;  // job_id = 1 in every one of these requests
    r.set_job_id("job-999999");
    add(m, "unknown job", r, grpc::StatusCode::NOT_FOUND);
  }
  add("ListJobs", "empty", ListJobsRequest(), grpc::StatusCode::OK);
  add("ListMembers", "empty", ListMembersRequest(), grpc::StatusCode::OK);
}

void AddClusterServiceCases(const CaseAdder& add) {
  {
    RegisterRequest r;
    add("Register", "no role", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_role(static_cast<MemberRole>(99));
    add("Register", "unknown role", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_role(MEMBER_ROLE_SHARD);
    add("Register", "shard without an address", r, grpc::StatusCode::INVALID_ARGUMENT);
    r.set_role(MEMBER_ROLE_WORKER);
    r.set_name("has space");
    add("Register", "name with a space", r, grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    HeartbeatRequest r;
    r.set_member_id("ghost#1");
    add("Heartbeat", "unknown member", r, grpc::StatusCode::NOT_FOUND);
    GetAssignmentRequest g;
    g.set_member_id("ghost#1");
    g.set_wait_ms(INT64_MAX);
    add("GetAssignment", "unknown member, endless wait", g, grpc::StatusCode::NOT_FOUND);
    ReportProgressRequest p;
    p.set_member_id("ghost#1");
    add("ReportProgress", "unknown member", p, grpc::StatusCode::NOT_FOUND);
  }
  {
    KvSetRequest s;
    s.set_job_id("job-999999");
    s.set_key("k");
    add("KvSet", "unknown job", s, grpc::StatusCode::NOT_FOUND);
    s.set_value(std::string(2 << 20, 'v'));
    add("KvSet", "2 MiB value, no member", s, grpc::StatusCode::NOT_FOUND);
    KvGetRequest g;
    g.set_job_id("job-999999");
    g.set_key("k");
    g.set_wait_ms(INT64_MAX);
    add("KvGet", "unknown job, endless wait", g, grpc::StatusCode::NOT_FOUND);
    KvAddRequest a;
    a.set_job_id("job-999999");
    a.set_key("k");
    a.set_delta(INT64_MAX);
    add("KvAdd", "unknown job", a, grpc::StatusCode::NOT_FOUND);
  }
}

CaseTable Table() {
  CaseTable t;
  AddParameterCallCases(CaseAdder(&t, "/pstrain.ParameterService/"));
  AddParameterAdminCases(CaseAdder(&t, "/pstrain.ParameterService/"));
  AddJobServiceCases(CaseAdder(&t, "/pstrain.JobService/"));
  AddClusterServiceCases(CaseAdder(&t, "/pstrain.ClusterService/"));
  AddEmbeddingCases(CaseAdder(&t, "/pstrain.EmbeddingService/"));
  return t;
}

class GrpcHostileTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(s_.Start(::testing::TempDir() + "/hostile-grpc").ok()); }
  void TearDown() override { s_.Stop(); }

  std::string TargetOf(const std::string& method) {
    const bool shard = method.rfind("/pstrain.ParameterService/", 0) == 0 ||
                       method.rfind("/pstrain.EmbeddingService/", 0) == 0;
    return shard ? s_.ps_server->local_target() : s_.coordinator_server->local_target();
  }

  InProcessServices s_;
};

TEST_F(GrpcHostileTest, EveryRpcOfEveryServiceHasHostileCases) {
  const auto table = Table();
  std::set<std::string> methods;
  for (const char* service :
       {"pstrain.ParameterService", "pstrain.EmbeddingService", "pstrain.JobService", "pstrain.ClusterService"}) {
    const google::protobuf::ServiceDescriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    ASSERT_NE(d, nullptr) << service;
    for (int i = 0; i < d->method_count(); ++i) {
      const std::string full = absl::StrCat("/", service, "/", d->method(i)->name());
      methods.insert(full);
      EXPECT_GT(table.count(full), 0u) << full << " has no hostile cases: add them to the table";
    }
  }
  for (const auto& [method, cases] : table) EXPECT_GT(methods.count(method), 0u) << method << " is not an RPC";
  // The coordinator's services register exactly their descriptor's methods.
  std::set<std::string> registered(s_.jobs->method_names().begin(), s_.jobs->method_names().end());
  registered.insert(s_.cluster->method_names().begin(), s_.cluster->method_names().end());
  registered.insert(s_.embedding_service->method_names().begin(), s_.embedding_service->method_names().end());
  for (const std::string& m : methods) {
    if (m.rfind("/pstrain.ParameterService/", 0) != 0) {
      EXPECT_GT(registered.count(m), 0u) << m;
    }
  }
}

TEST_F(GrpcHostileTest, HostileRequestsGetFittingCodesAndBoundedMessages) {
  // A table "job" of attempt 2 for the cases that need one.
  {
    InitTableRequest init;
    init.set_job("job");
    init.set_attempt(2);
    init.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    init.mutable_config()->mutable_optimizer()->set_lr(1);
    init.mutable_config()->set_consistency(ASYNC);
    init.mutable_config()->set_num_workers(1);
    InitTableResponse resp;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { s_.store->InitTableAsync(init, {}, &resp, {}, d); }).ok());
    InitEmbeddingsRequest embeddings;
    embeddings.set_job("job");
    embeddings.set_attempt(2);
    embeddings.set_num_workers(1);
    embeddings.set_consistency(ASYNC);
    embeddings.set_num_shards(1);
    EmbeddingTableConfig* t = embeddings.add_tables();
    t->set_name("t");
    t->set_dim(2);
    t->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
    t->mutable_optimizer()->set_lr(1);
    InitEmbeddingsResponse made;
    ASSERT_TRUE(s_.embeddings->Init(embeddings, &made).ok());
  }
  const std::string garbage("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);
  for (const auto& [method, cases] : Table()) {
    const std::string target = TargetOf(method);
    grpc::Status s = RawCall(target, method, garbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << method;
    // Every string field 1 MiB: whatever the code, the message quotes at
    // most a prefix.
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            method.substr(1, method.rfind('/') - 1));
    const google::protobuf::MethodDescriptor* md = service->FindMethodByName(method.substr(method.rfind('/') + 1));
    std::unique_ptr<google::protobuf::Message> request(
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(md->input_type())->New());
    s = RawCall(target, method, WithStrings(request.get(), std::string(1 << 20, 'x')));
    EXPECT_LT(s.error_message().size(), 2048u) << method << ": " << s.error_message().substr(0, 200);
    // Every string field not UTF-8 (which protobuf will not parse): refused
    // as malformed, like any bytes that are not the message.
    request.reset(request->New());
    const std::string not_utf8 = WithStrings(request.get(), std::string("\xff\xfe", 2));
    if (!not_utf8.empty()) {
      s = RawCall(target, method, not_utf8);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << " (not UTF-8): " << s.error_message();
      EXPECT_FALSE(s.error_message().empty()) << method;
    }
    for (const Case& c : cases) {
      s = RawCall(target, method, c.bytes);
      EXPECT_EQ(s.error_code(), c.code) << method << " (" << c.name << "): " << s.error_message();
      if (!s.ok()) {
        EXPECT_FALSE(s.error_message().empty()) << method << " (" << c.name << ")";
        EXPECT_LT(s.error_message().size(), 2048u) << method << " (" << c.name << ")";
      }
    }
  }
  // Still serving, and the table is as it was.
  EXPECT_EQ(*CheckHealth(s_.ps_server->local_target(), "", absl::Seconds(5)), "SERVING");
  EXPECT_EQ(*CheckHealth(s_.coordinator_server->local_target(), "", absl::Seconds(5)), "SERVING");
  StatsRequest stats;
  stats.set_job("job");
  StatsResponse st;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { s_.store->StatsAsync(stats, &st, {}, d); }).ok());
  EXPECT_EQ(st.tables(0).attempt(), 2u);
  EXPECT_EQ(st.tables(0).pushes_applied(), 0u);
  EXPECT_TRUE(s_.coordinator->ListJobs().empty());
  EmbeddingStatsRequest embedding_stats;
  embedding_stats.set_job("job");
  EmbeddingStatsResponse est;
  ASSERT_TRUE(s_.embeddings->Stats(embedding_stats, &est).ok());
  EXPECT_EQ(est.tables(0).rows(), 0);  // no hostile request made a row
  EXPECT_EQ(est.tables(0).updates(), 0);
}

}  // namespace
}  // namespace pstrain
