// embedding_export OUT FILE...: a checkpoint's embedding tables (every
// shard's SaveEmbeddings file) as one file torch.load reads
// (worker/embedding_export.h).
#include <cstdio>
#include <string>
#include <vector>

#include "worker/embedding_export.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT FILE...\n", argv[0]);
    return 2;
  }
  const std::vector<std::string> files(argv + 2, argv + argc);
  const absl::Status s = pstrain::ExportEmbeddings(files, argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "embedding_export: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", argv[1]);
  return 0;
}
