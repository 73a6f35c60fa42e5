// `cuarena replay`: settings checked, traces loaded, every row replayed through the allocator
// registry, results printed and written.
#include "cuarena/replay/replay_command.hpp"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/replay/allocator_registry.hpp"
#include "cuarena/replay/gpu_replay.hpp"
#include "cuarena/replay/output.hpp"
#include "cuarena/replay/torch_sim.hpp"

namespace cuarena::replay {

namespace {

bool has(const std::vector<std::string>& v, const char* x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// --config (else $CUARENA_CONF; --config '' is the defaults), --capacity and --torch-conf,
// checked.
SimOptions sim_options(const ReplayArgs& a) {
  SimOptions sim;
  if (!a.config) {
    try {
      const char* env = std::getenv("CUARENA_CONF");
      parse_replay_config(env ? env : "", sim);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("$CUARENA_CONF: ") + e.what());
    }
  } else {
    try {
      parse_replay_config(*a.config, sim);
    } catch (const ConfigError& e) {
      // PyTorch's keys (max_split_size_mb, ...) are a common slip: say where they go.
      bool torch_keys = true;
      try {
        TorchConf::parse(*a.config);
      } catch (const ConfigError&) {
        torch_keys = false;
      }
      if (!torch_keys) throw;
      throw ConfigError(std::string(e.what()) +
                        " (PyTorch's allocator settings go to --torch-conf, for the "
                        "torch-native-sim and torch-expandable-sim rows)");
    }
  }
  const std::string capacity_arg = "--capacity " + clip(a.capacity);
  if (!a.capacity.empty()) {
    sim.capacity = parse_size(a.capacity, "--capacity");
    if (sim.capacity < sim.device.granularity)
      throw ConfigError(capacity_arg + " is smaller than one granule (sim_granularity " +
                        size_text(sim.device.granularity) + ")");
    if (sim.capacity > kMaxDeviceBytes)
      throw ConfigError(capacity_arg + " is larger than any device (at most 16TiB)");
  }
  const std::uint64_t g = sim.device.granularity, capacity = sim_capacity_bytes(sim);
  if (capacity > max_sim_capacity(g)) {
    throw ConfigError(
        (a.capacity.empty() ? "sim_capacity " + format_bytes(capacity) : capacity_arg) + " is " +
        std::to_string(capacity / g) + " granules of sim_granularity " + format_bytes(g) +
        "; the simulator takes at most " + std::to_string(kMaxSimGranules) + " (" +
        format_bytes(max_sim_capacity(g)) +
        " at this granularity): a smaller capacity or a larger sim_granularity");
  }
  sim.torch_conf = a.torch_conf;
  sim.series = a.series || !a.report.empty();
  if (a.publish) sim.on_replay_start = publish_replay;
  sim.pace_us = a.pace_us;
  return sim;
}

}  // namespace

int run_replay(ReplayArgs a) {
  SimOptions sim = sim_options(a);
  const bool gpu = has(a.backends, "cuda");
  const bool on_sim = has(a.backends, "sim");
  const bool explicit_allocators = !a.allocators.empty();
  if (a.allocators.empty()) a.allocators = default_allocators(on_sim, gpu);
  check_allocators(a.allocators, on_sim, gpu);
  check_torch_conf(a.torch_conf, a.allocators);
  if (a.verify && !gpu) throw ConfigError("--verify needs --backend cuda (it tags real memory)");
  if (a.gpu_lag != 0 && !gpu)
    throw ConfigError(
        "--gpu-lag needs --backend cuda (on the simulator: --config sim_event_latency:N)");
  if (gpu) {
    const std::string why = cuda_unavailable_reason(a.device);
    if (!why.empty()) throw ConfigError("--backend cuda: " + why);
    a.allocators = available_on_gpu(a.allocators, explicit_allocators, std::cerr);
  }
  if ((a.publish || a.pace_us != 0) && !(on_sim && has(a.allocators, "cuarena")))
    throw ConfigError(
        "--publish and --pace act on the cuarena sim row: replay it (--backend sim, "
        "--allocator cuarena)");
  if (a.series && a.json.empty())
    throw ConfigError("--series adds the time series to the JSON: give --json FILE too");
  // Fail now, not after a long replay, if the outputs cannot be written (and the report drawn).
  if (!a.json.empty()) check_json(a.json);
  if (!a.report.empty()) check_report(a.report);
  // Load everything first, so a bad file is reported before any long replay; the others are
  // still replayed and the exit status is 2 at the end.
  using Devices = std::vector<std::pair<int, std::vector<Event>>>;
  std::vector<std::pair<std::string, Devices>> traces;
  bool bad_input = false;
  for (const std::string& path : a.traces) {
    try {
      Devices by_device = split_by_device(load_trace(path));  // one pass, however many devices
      for (const auto& [device, ev] : by_device) {
        try {
          check_device_totals(ev, device);
        } catch (const TraceError& e) {
          throw TraceError(path + ": " + e.what());
        }
      }
      traces.emplace_back(path, std::move(by_device));
    } catch (const TraceError& e) {
      std::cerr << "cuarena: error: " << error_line(e.what(), {path}) << '\n';
      bad_input = true;
    }
  }
  if (traces.empty()) return 2;  // nothing to replay: no table, no JSON

  std::vector<Result> results;
  bool failures = false;
  Notes notes;  // per-device notes, one line per trace and text (flushed after each trace)
  for (const auto& [path, by_device] : traces) {
    if (by_device.empty())
      std::cerr << "cuarena replay: " << clip(path) << ": the trace has no events\n";
    const std::string trace = trace_name(path);
    for (const auto& [device, ev] : by_device) {
      const bool one = by_device.size() == 1 && device == 0;
      const std::string label = one ? "" : "cuda" + std::to_string(device);
      const std::string name = one ? trace : trace + ":" + label;
      const RowContext c{path, ev, trace, label, a, sim, notes, explicit_allocators};
      for (const std::string& allocator : a.allocators) {
        const AllocatorEntry& entry = *find_allocator(allocator);
        std::vector<std::optional<Result>> rows;
        if (entry.trace) rows.push_back(entry.trace(allocator, c));
        if (entry.sim && on_sim) rows.push_back(entry.sim(allocator, c));
        if (entry.cuda && gpu) {
          try {
            rows.push_back(entry.cuda(allocator, c));
          } catch (const std::runtime_error& e) {  // report, go on with the other allocators
            std::cerr << "cuarena: error: " << error_line(e.what(), {path}) << '\n';
            failures = true;
          }
        }
        for (auto& row : rows) {
          if (!row) continue;
          row->trace = name;
          row->device = device;
          results.push_back(std::move(*row));
        }
      }
    }
    notes.flush(std::cerr);
  }
  bool out_of_memory = false;  // a replayed row (not the recording) ran out of memory
  const bool verdicts = !a.capacity.empty() || a.check;
  if (verdicts) {
    for (Result& r : results) {
      if (r.allocator == "recorded")
        r.capacity_bytes = sim_capacity_bytes(sim);
      else
        out_of_memory = out_of_memory || r.ooms > 0;
      r.verdict = verdict(r);
    }
  }
  print_table(std::cout, results);
  if (verdicts) {
    std::cout << '\n';
    print_verdicts(std::cout, results);
  }
  if (!a.json.empty()) write_json(a.json, results, a.series);
  if (!a.report.empty()) write_report(a.report, results);
  if (bad_input) return 2;  // bad input outranks a failed replay
  return failures || (a.check && out_of_memory) ? 1 : 0;
}

}  // namespace cuarena::replay
