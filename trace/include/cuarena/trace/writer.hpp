// The `.cuat` writer (trace/FORMAT.md), used by the replayer and the LD_PRELOAD shim.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cuarena/trace/format.hpp"

namespace cuarena::cuat {

/// A write that failed; what() names the file and the cause.
class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Writes `events` (devices one after another, as FORMAT.md requires) as an uncompressed `.cuat`
/// file. A regular file is written beside `path` and renamed into place, so a failed write
/// leaves nothing; every write, the flush and the close are checked. Throws WriteError.
void write(const std::string& path, const std::vector<Event>& events);

}  // namespace cuarena::cuat
