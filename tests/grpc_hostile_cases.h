// The hostile cases of tests/grpc_hostile_test, by method: what each
// method is sent and which code it must answer. The embedding service's
// cases live in grpc_hostile_embedding_cases.cc.
#ifndef PSTRAIN_TESTS_GRPC_HOSTILE_CASES_H_
#define PSTRAIN_TESTS_GRPC_HOSTILE_CASES_H_

#include <grpcpp/support/status.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/message.h"

namespace pstrain {

struct Case {
  std::string name;
  std::string bytes;
  grpc::StatusCode code;
};

// The hostile cases of each method, by full name
// ("/pstrain.ParameterService/Push").
using CaseTable = std::map<std::string, std::vector<Case>>;

// Adds cases to the table for the methods of one service.
class CaseAdder {
 public:
  CaseAdder(CaseTable* table, std::string service) : table_(table), service_(std::move(service)) {}
  // `m` sent to `method` of the service is answered with `code`.
  void operator()(const std::string& method, const std::string& name, const google::protobuf::Message& m,
                  grpc::StatusCode code) const {
    (*table_)[service_ + method].push_back({name, m.SerializeAsString(), code});
  }

 private:
  CaseTable* table_;
  std::string service_;
};

// EmbeddingService's cases; the embedding job "job" (attempt 2, table "t"
// of dim 2) exists.
void AddEmbeddingCases(const CaseAdder& add);

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_GRPC_HOSTILE_CASES_H_
