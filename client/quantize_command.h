// `pstrain export --quantize dynamic|static`: after the fp32 weights are
// written, pstrain-quantize (quantize/quantize_export_main.cc, the binary
// that links LibTorch; the CLI does not) turns them into an int8 TorchScript
// module and prints its size and latency beside fp32 (docs/quantization.md).
#ifndef PSTRAIN_CLIENT_QUANTIZE_COMMAND_H_
#define PSTRAIN_CLIENT_QUANTIZE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>

namespace pstrain {

struct QuantizeArgs {
  std::string mode;         // "" (no int8 export), dynamic, static
  std::string int8_path;    // default: the fp32 file's name with .int8.pt
  std::string calibration;  // static: a torch.save file with "inputs"
  std::string engine = "onednn";
};

void AddQuantizeOptions(CLI::App* export_cmd, QuantizeArgs* args);

// Runs `binary` (pstrain-quantize) on the exported `weights_path`; its
// output goes to this process's. The exit code: 0, or 1 with the reason on
// stderr.
int RunQuantize(const QuantizeArgs& args, const std::string& binary, const std::string& weights_path);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_QUANTIZE_COMMAND_H_
