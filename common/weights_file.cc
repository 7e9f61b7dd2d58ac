#include "common/weights_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {

// Written without TorchScript's type tags on the dict: torch.load's
// weights_only mode (PyTorch 2.6's default) refuses the restore_type_tag
// global that torch::pickle_save emits for a c10::Dict.
absl::StatusOr<std::string> SerializeWeights(const NamedTensors& params) {
  try {
    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& [name, t] : params) dict.insert(name, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    std::vector<char> pickled;
    torch::jit::Pickler pickler([&](const char* bytes, size_t n) { pickled.insert(pickled.end(), bytes, bytes + n); },
                                /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                                /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(dict);
    pickler.stop();
    std::string archive;
    {
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
        archive.append(static_cast<const char*>(bytes), n);
        return n;
      });
      torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
    }  // the writer finishes the archive when destroyed
    return archive;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("saving weights: ", e.what_without_backtrace()));
  }
}

absl::Status SaveWeights(const NamedTensors& params, const std::string& path) {
  auto bytes = SerializeWeights(params);
  if (!bytes.ok()) return bytes.status();
  return WriteFileAtomically(path, *bytes);
}

absl::StatusOr<NamedTensors> ParseWeights(absl::string_view bytes, const std::string& what) {
  try {
    c10::IValue value = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
    if (!value.isGenericDict()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " holds a ", value.tagKind(), ", not a dict of tensors"));
    }
    NamedTensors out;
    for (const auto& item : value.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor()) {
        return absl::InvalidArgumentError(absl::StrCat(what, " is not a dict of name to tensor"));
      }
      out.emplace_back(item.key().toStringRef(), item.value().toTensor());
    }
    return out;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("reading ", what, " as a torch.save file: ", Quote(e.what_without_backtrace(), 200)));
  }
}

absl::StatusOr<NamedTensors> ReadWeightsFile(const std::string& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return ParseWeights(*bytes, path);
}

}  // namespace pstrain
