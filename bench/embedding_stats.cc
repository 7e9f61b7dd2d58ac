// embedding_stats: what a job's embedding tables hold on each shard, for
// `bench/run.sh embeddings` (the scale line's rows held and evictions).
//
//   embedding_stats --shards=HOST:PORT,HOST:PORT --job=NAME [--job_secret_file=F]
//
// Calls EmbeddingService.Stats on every shard and prints one JSON line: per
// shard and in total, the rows held, their bytes, rows created, LRU and TTL
// evictions, lookups and ids not admitted. Exit status 0, or 1 naming the
// shard whose call failed.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/embedding.grpc.pb.h"
#include "rpc/grpc_tensor_coding.h"

ABSL_FLAG(std::string, shards, "", "Comma-separated host:port of the job's shards.");
ABSL_FLAG(std::string, job, "", "The job's name.");
ABSL_FLAG(std::string, job_secret_file, "", "A file holding the job's secret (none: a job started without one).");
ABSL_FLAG(int, timeout_s, 10, "Deadline of each call, in seconds.");

namespace {

struct Totals {
  int64_t rows = 0, bytes = 0, created = 0, evicted_lru = 0, evicted_ttl = 0, lookups = 0, not_admitted = 0;
  void Add(const pstrain::EmbeddingTableStatsProto& t) {
    rows += t.rows();
    bytes += static_cast<int64_t>(t.bytes());
    created += t.created();
    evicted_lru += t.evicted_lru();
    evicted_ttl += t.evicted_ttl();
    lookups += t.lookups();
    not_admitted += t.not_admitted();
  }
  void Add(const Totals& o) {
    rows += o.rows, bytes += o.bytes, created += o.created, evicted_lru += o.evicted_lru;
    evicted_ttl += o.evicted_ttl, lookups += o.lookups, not_admitted += o.not_admitted;
  }
  std::string Json() const {
    return absl::StrCat("{\"rows\": ", rows, ", \"bytes\": ", bytes, ", \"created\": ", created,
                        ", \"evicted_lru\": ", evicted_lru, ", \"evicted_ttl\": ", evicted_ttl,
                        ", \"lookups\": ", lookups, ", \"not_admitted\": ", not_admitted, "}");
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> shards = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (shards.empty() || absl::GetFlag(FLAGS_job).empty()) {
    std::fprintf(stderr, "embedding_stats: give --shards and --job\n");
    return 2;
  }
  std::string secret;
  if (!absl::GetFlag(FLAGS_job_secret_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_job_secret_file));
    std::stringstream ss;
    ss << in.rdbuf();
    secret = std::string(absl::StripAsciiWhitespace(ss.str()));
  }
  Totals total;
  std::vector<std::string> per_shard;
  for (size_t s = 0; s < shards.size(); ++s) {
    auto stub = pstrain::EmbeddingService::NewStub(grpc::CreateChannel(shards[s], grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
    if (!secret.empty()) context.AddMetadata(pstrain::kJobSecretMetadata, secret);
    pstrain::EmbeddingStatsRequest request;
    request.set_job(absl::GetFlag(FLAGS_job));
    pstrain::EmbeddingStatsResponse response;
    const grpc::Status st = stub->Stats(&context, request, &response);
    if (!st.ok()) {
      std::fprintf(stderr, "embedding_stats: shard %zu (%s): %s\n", s, shards[s].c_str(), st.error_message().c_str());
      return 1;
    }
    Totals t;
    for (const auto& table : response.tables()) t.Add(table);
    per_shard.push_back(t.Json());
    total.Add(t);
  }
  std::printf("{\"shards\": [%s], \"total\": %s}\n", absl::StrJoin(per_shard, ", ").c_str(), total.Json().c_str());
  return 0;
}
