#include "worker/checkpoint_buffers.h"

#include <c10/core/GradMode.h>
#include <zlib.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {
namespace {

// A QAT network's quantizers are a few kB; anything near this is not ours.
constexpr uint64_t kMaxBuffersBytes = 64 << 20;

uint32_t Crc32(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

}  // namespace

absl::StatusOr<SaveTableResponse> SaveBuffersFile(const NamedTensors& buffers, const std::string& path) {
  auto bytes = SerializeWeights(buffers);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = WriteFileAtomically(path, *bytes); !s.ok()) return s;
  SaveTableResponse saved;
  saved.set_bytes(bytes->size());
  saved.set_crc32(Crc32(*bytes));
  return saved;
}

absl::StatusOr<NamedTensors> ReadCheckpointBuffers(const std::string& dir) {
  auto manifest = ReadManifest(dir);
  if (!manifest.ok()) return manifest.status();
  if (manifest->buffers.empty()) return NamedTensors();
  const CheckpointManifest::ShardFile& f = manifest->buffers[0];
  const std::string path = dir + "/" + f.file;
  auto bytes = ReadRegularFile(path, kMaxBuffersBytes);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != f.bytes || Crc32(*bytes) != f.crc32) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is not the one its manifest describes ",
                                            "(size or crc32 differs)"));
  }
  return ParseWeights(*bytes, path);
}

absl::Status LoadBuffersInto(const NamedTensors& saved, const NamedTensors& buffers) {
  std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
  if (by_name.size() != buffers.size()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint holds ", by_name.size(),
                                                      " model buffers, the model has ", buffers.size(),
                                                      " (another model or quantization settings?)"));
  }
  for (const auto& [name, into] : buffers) {
    auto it = by_name.find(name);
    const char* why = it == by_name.end()                          ? "is missing"
                      : !it->second.sizes().equals(into.sizes())   ? "has another shape than the model's"
                      : it->second.scalar_type() != into.scalar_type() ? "has another dtype than the model's"
                                                                     : nullptr;
    if (why != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint's model buffer ", Quote(name, 64), " ", why,
          ": another model or quantization settings (weights: per_channel or per_tensor)?"));
    }
  }
  c10::NoGradGuard no_grad;
  for (const auto& [name, into] : buffers) {
    at::Tensor t = into;  // the model's own tensor: copy_ writes through
    t.copy_(by_name.at(name));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
