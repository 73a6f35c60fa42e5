// The page's shared-memory object: created, mapped, unmapped, removed. POSIX calls only; every
// failure comes back as text, never as an exception or a signal.
#pragma once

#include <string>

#include "cuarena/monitor_page.hpp"

namespace cuarena::monitor::detail {

/// Creates `name` (after removing a stale one of that name) with mode 0600, kMonitorPageBytes
/// long with its memory allocated (a full /dev/shm fails here, not later with SIGBUS on a
/// store), and maps it read-write. Zero-filled. nullptr on failure, `error` saying why.
MonitorPage* create_page(const std::string& name, std::string& error);

/// Unmaps a page from create_page (nullptr: nothing).
void unmap_page(MonitorPage* page);

/// Removes the object `name` (readers that mapped it keep their mapping).
void remove_page(const std::string& name);

}  // namespace cuarena::monitor::detail
