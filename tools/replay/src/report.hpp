// Output of `cuarena replay`: a table for people, JSON for programs.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "replay.hpp"

namespace cuarena::replay {

/// Writes the results as an aligned text table.
void print_table(std::ostream& out, const std::vector<Result>& results);

/// Writes {"results": [...]} to `path`. Throws TraceError when the file cannot be written.
void write_json(const std::string& path, const std::vector<Result>& results);

/// Reads what write_json() wrote. Throws TraceError.
std::vector<Result> read_json(const std::string& path);

}  // namespace cuarena::replay
