// Running a helper program (the Python trace converter, the PyTorch replay process).
#pragma once

#include <string>
#include <vector>

namespace cuarena::replay {

/// Runs argv[0] (searched on PATH) with `argv`, the current environment plus `env`
/// ("NAME=value" entries override), stdout inherited, stderr captured into `err`. Returns the
/// exit status (128 + signal when killed). Throws std::runtime_error if it cannot start.
int run_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                std::string& err);

/// The directory holding the running executable.
std::string executable_dir();

}  // namespace cuarena::replay
