// `cuarena replay`: what it was asked (main.cpp fills it from the command line) and the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cuarena::replay {

struct ReplayArgs {
  std::vector<std::string> traces;
  std::vector<std::string> allocators;  ///< empty: the registry's defaults for the backends
  std::vector<std::string> backends = {"sim"};
  std::string capacity;
  bool min_capacity = false;
  bool check = false;  ///< exit 1 when a replayed row runs out of memory
  bool verify = false;
  int device = 0;
  std::uint64_t gpu_lag = 0;          ///< GpuReplayOptions::gpu_lag of every GPU row
  std::optional<std::string> config;  ///< nullopt: $CUARENA_CONF; "" (given empty): the defaults
  std::string torch_conf;
  std::string json;
  bool series = false;        ///< --json gains each row's series
  std::string report;         ///< --report PATH.html|PATH.png
  bool publish = false;       ///< the cuarena sim row on a monitor page (cuarena top) as it replays
  std::uint64_t pace_us = 0;  ///< sleep per event of the cuarena sim row's replay
};

/// Replays every trace through every allocator asked for (allocator_registry.hpp), prints the
/// table (and verdicts), writes --json and --report. Returns the exit status: 0, 1 (a row
/// failed, or ran out of memory under --check), 2 (a trace could not be read). Throws
/// ConfigError for a bad setting, before any replay.
int run_replay(ReplayArgs a);

}  // namespace cuarena::replay
