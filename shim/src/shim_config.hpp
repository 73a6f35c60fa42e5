// The shim's settings, from the environment, read once at load.
//
//   CUARENA_CONF      cuarena's configuration (the core's keys, see config.hpp) plus the shim's:
//                       memory_limit:SIZE        most physical memory held per device (bytes or
//                                                64GiB / 80GB); default: the whole device
//                       pending_free_bytes:SIZE  synchronously freed bytes held before a free
//                                                fences them (default 1 GiB; held_frees.hpp)
//                       snug_factor:N            while frees are held, a cached block more than
//                                                N times a request is split for it only if no
//                                                held block fits within N times (default 4;
//                                                0: any cached block serves, never a fence)
//                       serve_shareable:BOOL     cuMemCreate asking for a POSIX file-descriptor
//                                                handle (XLA asks on every buffer) is served
//                                                unless NCCL or NVSHMEM asks; exporting such a
//                                                handle then fails (default True; False: the
//                                                driver's, for programs exporting it)
//   CUARENA_LOG       1 (or stderr): one stderr line per event; a path: those lines appended there
//   CUARENA_SUMMARY   1: one line at exit (peaks, ratio, calls served and passed through)
//   CUARENA_TRACE     path: the allocations recorded as a .cuat trace at exit (cuarena replay)
//   CUARENA_KEEP_TORCH_CACHE  1: leave PYTORCH_NO_CUDA_MEMORY_CACHING alone
//   CUARENA_MONITOR   0: no monitor page for `cuarena top` (read by DeviceState, through
//                     monitor::monitor_enabled())
#pragma once

#include <cstddef>
#include <string>

#include "cuarena/config.hpp"

namespace cuarena::shim {

struct ShimConfig {
  Config core;  ///< the core's keys of CUARENA_CONF (wait_before_grow on and internal_dependencies
                ///< off unless set)
  std::size_t memory_limit = 0;  ///< bytes per device; 0: the device's memory
  std::size_t pending_free_bytes = std::size_t{1} << 30;  ///< held frees that force a fence
  std::size_t snug_factor = 4;                            ///< see CUARENA_CONF above; 0: no bound
  bool serve_shareable = true;                            ///< see CUARENA_CONF above
  std::string log_path;                                   ///< "" off, "-" stderr, else a file
  bool summary = false;
  std::string trace_path;  ///< "" off
  bool keep_torch_cache = false;

  /// Reads the environment. Throws ConfigError naming the variable, key and position.
  static ShimConfig from_env();
  /// Parses a CUARENA_CONF value: the core's keys and table()'s. Throws ConfigError naming the
  /// key and its position (parse_config).
  static ShimConfig parse(const std::string& conf);
  /// The shim's own keys of CUARENA_CONF (config_table.hpp).
  static const ConfigTable<ShimConfig>& table();
};

}  // namespace cuarena::shim
