#include "client/quantize_command.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

extern char** environ;

namespace pstrain {

void AddQuantizeOptions(CLI::App* export_cmd, QuantizeArgs* args) {
  export_cmd
      ->add_option("--quantize", args->mode,
                   "also write an int8 TorchScript module of a built-in model (mlp, lenet): dynamic | static")
      ->check(CLI::IsMember({"dynamic", "static"}));
  export_cmd->add_option("--int8_file", args->int8_path, "where the int8 module goes (default: FILE.int8.pt)");
  export_cmd->add_option("--calibration", args->calibration,
                         "static: a torch.save file whose \"inputs\" are example inputs, normalised as in training "
                         "(a QAT job's learned scales need none)");
  export_cmd->add_option("--engine", args->engine, "quantized engine (default onednn; qnnpack)");
}

int RunQuantize(const QuantizeArgs& args, const std::string& binary, const std::string& weights_path) {
  std::string out = args.int8_path;
  if (out.empty()) {
    out = weights_path;
    if (out.size() > 3 && out.compare(out.size() - 3, 3, ".pt") == 0) out.resize(out.size() - 3);
    out += ".int8.pt";
  }
  std::vector<std::string> argv = {binary, "auto", weights_path, out, args.mode, "--engine", args.engine};
  if (!args.calibration.empty()) {
    argv.push_back("--calibration");
    argv.push_back(args.calibration);
  }
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = 0;
  if (int rc = posix_spawn(&pid, binary.c_str(), nullptr, nullptr, cargv.data(), environ); rc != 0) {
    std::fprintf(stderr, "pstrain: cannot run %s (%s); build it with `bazel build //quantize:pstrain-quantize`\n",
                 binary.c_str(), std::strerror(rc));
    return 1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::fprintf(stderr, "pstrain: waiting for %s: %s\n", binary.c_str(), std::strerror(errno));
      return 1;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "pstrain: the int8 export failed (the fp32 weights are in %s)\n", weights_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace pstrain
