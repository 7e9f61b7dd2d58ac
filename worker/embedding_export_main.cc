// embedding_export OUT FILE... [-- FILE...]...: a checkpoint's embedding
// tables (every shard's SaveEmbeddings file; an incremental checkpoint's
// after those of its bases, oldest first, each checkpoint's files apart
// by "--") as one file torch.load reads (worker/embedding_export.h).
#include <cstdio>
#include <string>
#include <vector>

#include "worker/embedding_export.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT FILE... [-- FILE...]...\n", argv[0]);
    return 2;
  }
  std::vector<std::vector<std::string>> chain(1);
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      chain.emplace_back();
    } else {
      chain.back().push_back(argv[i]);
    }
  }
  const absl::Status s = pstrain::ExportEmbeddings(chain, argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "embedding_export: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", argv[1]);
  return 0;
}
