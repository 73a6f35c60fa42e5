// Trace input for the replayer: the compact `.cuat` format (trace/FORMAT.md), read by the format
// library (trace/), and everything else (PyTorch snapshots, RMM CSVs) converted to it by
// tools/trace/cuarena_trace.py, which uses Python's own pickle; converted traces are cached.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuarena/trace/format.hpp"

namespace cuarena::replay {

using Action = cuat::Action;
using Event = cuat::Event;

/// A trace that could not be read; what() is one line naming the file and the problem.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads a `.cuat` / `.cuat.gz` file. Throws TraceError.
std::vector<Event> read_cuat(const std::string& path);
/// The same, reading `file` but naming `path` in every error after the open: `file` holds
/// `path`'s converted events (a temporary or cached copy), and the user knows only `path`.
std::vector<Event> read_cuat(const std::string& file, const std::string& path);

/// Writes events as an uncompressed `.cuat` file. Throws TraceError.
void write_cuat(const std::string& path, const std::vector<Event>& events);

/// Reads any supported trace: `.cuat` directly, anything else through the Python converter.
/// Throws TraceError.
std::vector<Event> load_trace(const std::string& path);

/// The Python that runs the converter and the report script: $CUARENA_PYTHON, else the one
/// CMake found.
std::string python_executable();

/// The trace's name for reports: the file name without `.pickle`, `.gz`, `.cuat`, `.csv`.
std::string trace_name(const std::string& path);

}  // namespace cuarena::replay
