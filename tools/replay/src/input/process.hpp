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

/// A Python script the tools run: $`env_var` when set, else `name` in ../share beside the
/// executable where it exists (an installed copy: the Python package's cuarena/bin/cuarena runs
/// cuarena/share/`name`), else `source_path` (the source tree's, for a build-tree binary).
std::string script_path(const char* env_var, const char* name, const char* source_path);

}  // namespace cuarena::replay
