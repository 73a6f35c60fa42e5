// The replayer's allocators, one table: each name with its description and the function that
// replays it on each backend. The command line's --allocator choices and help, the default rows
// and run_replay's dispatch all read it.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/replay_command.hpp"
#include "cuarena/replay/report.hpp"
#include "cuarena/replay/trace.hpp"

namespace cuarena::replay {

/// What a row's replay gets: one device's events of one trace, and the run's settings.
struct RowContext {
  const std::string& path;           ///< the trace file
  const std::vector<Event>& events;  ///< the device's events
  const std::string& trace;          ///< trace_name(path), for notes
  const std::string& label;          ///< "" for a trace of one device, else "cudaN"
  const ReplayArgs& args;
  const SimOptions& sim;  ///< the simulator's settings (config, capacity, torch_conf, series)
  Notes& notes;
  bool asked_for;  ///< named with --allocator (a missing part is then an error, not a note)
};

/// One row's replay; std::nullopt: no row (a note says why).
using RowReplay = std::optional<Result> (*)(const std::string& allocator, const RowContext& c);

struct AllocatorEntry {
  const char* name;
  const char* description;    ///< for --help
  RowReplay trace = nullptr;  ///< from the trace alone, whatever --backend (recorded)
  RowReplay sim = nullptr;    ///< on --backend sim
  RowReplay cuda = nullptr;   ///< on --backend cuda
  bool by_default = true;     ///< replayed without --allocator (where its backend is on)
  /// Why this build cannot replay it on the GPU; empty when it can (nullptr: always can).
  std::string (*unavailable)() = nullptr;
};

/// Every allocator, in report order.
const std::vector<AllocatorEntry>& allocator_registry();
/// The entry called `name`; nullptr when there is none.
const AllocatorEntry* find_allocator(const std::string& name);
/// Every name (for --allocator's choices).
std::vector<std::string> allocator_names();
/// --allocator's help: every allocator, its backends and description.
std::string allocator_help();
/// The rows replayed without --allocator: the by_default entries whose backend is on.
std::vector<std::string> default_allocators(bool on_sim, bool on_cuda);
/// Throws ConfigError "--allocator NAME needs --backend sim|cuda" for a name that has no
/// replay on the backends given (or is unknown).
void check_allocators(const std::vector<std::string>& names, bool on_sim, bool on_cuda);
/// The names this build can replay on the GPU (AllocatorEntry::unavailable). One asked for by
/// name that it cannot is a ConfigError ("--allocator NAME: WHY"); defaults it cannot are
/// dropped with one line on `notes` per reason ("cuarena replay: a, b: skipped: WHY").
std::vector<std::string> available_on_gpu(const std::vector<std::string>& names, bool asked_for,
                                          std::ostream& notes);

// ---- The rows (the functions the table names) ----

/// recorded: the recording allocator's reserved bytes from the segment events (sim_rows.cpp).
std::optional<Result> recorded_row(const std::string& allocator, const RowContext& c);
/// cuarena on the simulator, with --min-capacity's checked search (sim_rows.cpp).
std::optional<Result> cuarena_sim_row(const std::string& allocator, const RowContext& c);
/// torch-native-sim, torch-expandable-sim (sim_rows.cpp).
std::optional<Result> torch_sim_row(const std::string& allocator, const RowContext& c);
/// PyTorch's allocator on the GPU in a process of its own, cuarena_torch_replay
/// (torch_process.cpp): torch-native, torch-expandable, torch-async.
std::optional<Result> torch_gpu_row(const std::string& allocator, const RowContext& c);
/// Every other GPU row, in this process (gpu_rows.cpp; gpu_rows_missing.cpp without CUDA).
std::optional<Result> gpu_row(const std::string& allocator, const RowContext& c);
/// Why --backend cuda cannot run here (no CUDA in this build, no driver, no device); empty
/// when it can (gpu_rows.cpp).
std::string cuda_unavailable_reason(int device);
/// Why this build has no RMM rows; empty when it has them (gpu_rows.cpp).
std::string rmm_rows_unavailable();

}  // namespace cuarena::replay
