#include "worker/weights_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace pstrain {

// torch.save's format (a zip archive: the pickle in data.pkl, each tensor's
// bytes in data/<n>), written without TorchScript's type tags on the dict:
// torch.load's weights_only mode (PyTorch 2.6's default) refuses the
// restore_type_tag global that torch::pickle_save emits for a c10::Dict.
absl::Status SaveWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const std::string& path) {
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
    std::vector<char> archive;
    {
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
        archive.insert(archive.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
        return n;
      });
      torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
    }  // the writer finishes the archive when destroyed
    return WriteFileAtomically(path, absl::string_view(archive.data(), archive.size()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("saving weights: ", e.what_without_backtrace()));
  }
}

}  // namespace pstrain
