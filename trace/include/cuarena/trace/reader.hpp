// The `.cuat` reader (trace/FORMAT.md): plain or gzip-compressed files, validated record by
// record against the format's rules and limits (as the Python reader, cuarena_trace.read_cuat,
// applies them), gzip members as Python's gzip module reads them. Only regular files are read.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cuarena/trace/format.hpp"

namespace cuarena::cuat {

/// A file that could not be read; what() is one line, "PATH: PROBLEM".
class ReadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Whether `path` (plain or gzipped) starts with the `.cuat` magic. Throws ReadError when it
/// cannot be opened or is not a regular file.
bool is_cuat(const std::string& path);

/// Reads and validates the events of `file`, naming `path` in every error (`file` may be a
/// temporary or cached copy of what the user knows as `path`). Memory grows with the records
/// read, never past FORMAT.md's limits; running out of it is a ReadError too. Throws ReadError.
std::vector<Event> read(const std::string& file, const std::string& path);

}  // namespace cuarena::cuat
