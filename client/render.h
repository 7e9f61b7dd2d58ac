// The CLI's tables: a job, the job list, the pool's members; and JSON.
#ifndef PSTRAIN_CLIENT_RENDER_H_
#define PSTRAIN_CLIENT_RENDER_H_

#include <cstdint>
#include <string>

#include "google/protobuf/message.h"
#include "proto/control.pb.h"

const char* StateName(pstrain::JobState s);
std::string Json(const google::protobuf::Message& m);
// "42s", "3m", "2h" since a Unix time in ms.
std::string Ago(int64_t unix_ms);
void PrintJobTable(const pstrain::JobStatus& st);
void PrintJobList(const pstrain::ListJobsResponse& resp);
void PrintMembers(const pstrain::ListMembersResponse& resp);

#endif  // PSTRAIN_CLIENT_RENDER_H_
