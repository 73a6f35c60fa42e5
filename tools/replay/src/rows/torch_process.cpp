// The torch-native, torch-expandable and torch-async GPU rows: PyTorch's allocator replayed by
// cuarena_torch_replay in a fresh process (it reads PYTORCH_CUDA_ALLOC_CONF once, at load).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cuarena/replay/allocator_registry.hpp"
#include "input/process.hpp"

namespace cuarena::replay {

std::optional<Result> torch_gpu_row(const std::string& mode, const RowContext& c) {
  const ReplayArgs& a = c.args;
  const std::string exe = executable_dir() + "/cuarena_torch_replay";
  if (!std::filesystem::exists(exe)) {
    const std::string why = mode +
                            ": this build has no PyTorch replayer (configure with "
                            "-DCUARENA_WITH_TORCH=ON where torch is installed)";
    if (c.asked_for) throw std::runtime_error(why);
    std::cerr << "cuarena replay: skipped " << why << '\n';
    return std::nullopt;
  }
  const std::string conf = mode == "torch-expandable" ? "expandable_segments:True"
                           : mode == "torch-async"    ? "backend:cudaMallocAsync"
                                                      : "";
  char tmpl[] = "/tmp/cuarena-torch-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) throw TraceError("cannot create a temporary file");
  close(fd);
  std::vector<std::string> argv = {exe, c.path, mode, tmpl, "--device", std::to_string(a.device)};
  if (a.verify) argv.push_back("--verify");
  if (a.gpu_lag > 1) {
    argv.push_back("--gpu-lag");
    argv.push_back(std::to_string(a.gpu_lag));
  }
  if (a.min_capacity) argv.push_back("--min-capacity");
  if (a.series || !a.report.empty()) argv.push_back("--series");
  std::string err;
  const int rc = run_process(argv, {"PYTORCH_CUDA_ALLOC_CONF=" + conf}, err);
  if (rc != 0) {
    std::remove(tmpl);
    // PyTorch's errors read "what():  <message>"; otherwise the first line says most.
    std::string why = err.substr(0, err.find('\n'));
    const std::size_t what = err.find("what():");
    if (what != std::string::npos) why = err.substr(what + 7, err.find('\n', what) - what - 7);
    throw std::runtime_error(c.path + ": " + mode + " replay failed (exit " + std::to_string(rc) +
                             "):" + why);
  }
  auto results = read_json(tmpl);
  std::remove(tmpl);
  return results.at(0);
}

}  // namespace cuarena::replay
