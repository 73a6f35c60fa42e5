// Reading a monitor page (monitor_page.hpp) from C++: for tests and tools. `cuarena top` reads
// pages in Python (allocator/torch/python/cuarena), under the same sequence lock.
#pragma once

#include <optional>
#include <string>

#include "cuarena/monitor_page.hpp"

namespace cuarena::monitor {

/// Copies `mapped` (a page mapped from another process or thread) into `out` under the
/// sequence lock. False when the writer was busy throughout `attempts` tries (each a copy of
/// the page; a rewrite takes microseconds, so a few tries are plenty).
bool copy_page(const MonitorPage& mapped, MonitorPage& out, int attempts = 1000);

/// The page named `name` (shm_open's name, "/cuarena.<uid>.<pid>.<device>"), copied under the
/// sequence lock; nullopt when it does not exist, cannot be mapped, is shorter than a page or
/// never held still. The magic and version are the caller's to check.
std::optional<MonitorPage> read_page(const std::string& name);

}  // namespace cuarena::monitor
