// What goes into a monitor page, field by field: the process's identity (written once) and
// each reading of the allocator (rewritten under the sequence lock).
#pragma once

#include <cstdint>
#include <string>

#include "cuarena/allocator.hpp"
#include "cuarena/monitor_page.hpp"
#include "cuarena/monitor_publisher.hpp"

namespace cuarena::monitor::detail {

struct Identity {
  PageKind kind = PageKind::kTorch;
  int device = 0;
  std::int64_t pid = 0;
  std::uint64_t start_ns = 0;
  std::string device_uuid;
  std::string command;
};

/// One rewrite's inputs.
struct Reading {
  Stats stats;
  Allocator::MemoryBreakdown breakdown;  ///< from the latest pool walk
  std::int64_t largest_free = 0;         ///< from the latest pool walk
  std::int64_t limit = 0;
  DeviceMemory device;
  std::uint64_t now_ns = 0;
};

/// Fills the header and leaves `page` marked as being written (seq odd) until the first
/// write_reading: a reader sees no page before its first figures.
void write_identity(MonitorPage& page, const Identity& id);

/// Rewrites the figures under the sequence lock.
void write_reading(MonitorPage& page, const Reading& r);

/// The process's command line (/proc/self/cmdline), arguments joined by spaces; "" if unreadable.
std::string command_line();

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
std::uint64_t now_ns();

}  // namespace cuarena::monitor::detail
