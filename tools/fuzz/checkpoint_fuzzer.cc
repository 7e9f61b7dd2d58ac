// libFuzzer target: the shard's checkpoint loader (ShardStore::LoadTableAsync)
// on arbitrary file contents with a matching size and crc32 (so the fuzzer
// reaches the field-by-field validation, not just the crc check).
// Invariants: no crash; a loaded table serves finite values.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "google/protobuf/stubs/logging.h"
#include "table/shard_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 is logged per parse
    return true;
  }();
  (void)quiet;
  static const std::string root = [] {
    char tmpl[] = "/tmp/pstrain-ckpt-fuzz.XXXXXX";
    return *pstrain::CanonicalRoot(mkdtemp(tmpl));
  }();
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  if (!pstrain::WriteFileAtomically(root + "/f.bin", bytes).ok()) return 0;
  pstrain::ShardStoreOptions options;
  options.checkpoint_root = root;
  options.max_bytes = 64 << 20;
  pstrain::ShardStore store(options);
  pstrain::LoadTableRequest req;
  req.set_job("job");
  req.mutable_config()->mutable_optimizer()->set_kind(pstrain::OptimizerConfig::ADAM);
  req.mutable_config()->mutable_optimizer()->set_lr(0.01);
  req.mutable_config()->set_consistency(pstrain::ASYNC);
  req.mutable_config()->set_num_workers(2);
  auto* f = req.add_files();
  f->set_path("f.bin");
  f->set_bytes(size);
  f->set_crc32(static_cast<uint32_t>(crc32(0L, data, static_cast<uInt>(size))));
  req.add_keys("a");
  req.add_keys("fc1.weight#0");
  pstrain::LoadTableResponse resp;
  if (!pstrain::WaitFor([&](pstrain::StatusCallback d) { store.LoadTableAsync(req, &resp, {}, d); }).ok()) return 0;
  pstrain::PullRequest pull;
  pull.set_job("job");
  pull.add_keys("a");
  pull.add_keys("fc1.weight#0");
  pstrain::PullResponse pr;
  std::vector<pstrain::TensorBuffer> values;
  if (!pstrain::WaitFor([&](pstrain::StatusCallback d) { store.PullAsync(pull, &pr, &values, {}, d); }).ok()) std::abort();
  for (const auto& v : values) {
    if (!pstrain::AllFinite(v.dtype, v.data, v.nbytes)) std::abort();
  }
  return 0;
}
