// `cuarena`: the command-line front end (replay traces, convert them).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "report.hpp"

using namespace cuarena;
using namespace cuarena::replay;

namespace {

struct ReplayArgs {
  std::vector<std::string> traces;
  std::vector<std::string> allocators = {"recorded", "cuarena"};
  std::string backend = "sim";
  std::string capacity;
  bool min_capacity = false;
  std::string config;
  std::string json;
};

int run_replay(const ReplayArgs& a) {
  SimOptions sim;
  if (a.config.empty()) {
    try {
      sim.config = Config::from_env();
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("$CUARENA_CONF: ") + e.what());
    }
  } else {
    sim.config = Config::parse(a.config);
  }
  if (!a.json.empty()) {
    // Fail now, not after a long replay, if the JSON cannot be written.
    std::ofstream probe(a.json, std::ios::app);
    if (!probe) throw TraceError(a.json + ": cannot open for writing");
  }
  if (!a.capacity.empty()) {
    sim.capacity = parse_size(a.capacity, "--capacity");
    if (sim.capacity < sim.config.sim_granularity)
      throw ConfigError("--capacity " + a.capacity + " is smaller than one granule");
  }
  // Load everything first, so a bad file fails before any long replay.
  std::vector<std::pair<std::string, std::vector<Event>>> traces;
  for (const std::string& path : a.traces) traces.emplace_back(path, load_trace(path));

  std::vector<Result> results;
  for (const auto& [path, events] : traces) {
    const std::vector<int> devices = devices_in(events);
    for (int device : devices) {
      const std::vector<Event> ev = device_events(events, device);
      std::string name = trace_name(path);
      if (devices.size() > 1 || device != 0) name += ":cuda" + std::to_string(device);
      for (const std::string& allocator : a.allocators) {
        Result r = allocator == "recorded" ? replay_recorded(ev) : replay_cuarena(ev, sim);
        r.trace = name;
        r.device = device;
        if (a.min_capacity && allocator == "cuarena")
          r.min_capacity_bytes = min_capacity(ev, sim, r.peak_reserved_bytes);
        results.push_back(std::move(r));
      }
    }
    if (devices.empty()) std::cerr << "cuarena replay: " << path << ": the trace has no events\n";
  }
  print_table(std::cout, results);
  if (!a.json.empty()) write_json(a.json, results);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cuarena: a CUDA caching allocator, and the tools to measure it"};
  app.require_subcommand(1);
  ReplayArgs ra;
  CLI::App* replay = app.add_subcommand(
      "replay", "Replay allocation traces (PyTorch snapshots .pickle[.gz], RMM CSV, .cuat) "
                "through the recorded allocator and cuarena");
  replay->add_option("TRACE", ra.traces, "Trace files")->required();
  replay->add_option("--allocator", ra.allocators, "Allocators to run: recorded, cuarena")
      ->delimiter(',')
      ->check(CLI::IsMember({"recorded", "cuarena"}));
  replay->add_option("--backend", ra.backend, "Device backend for cuarena: sim (simulated device)")
      ->check(CLI::IsMember({"sim"}));
  replay->add_option("--capacity", ra.capacity,
                     "Device capacity for the simulator (80GiB, 512MiB, bytes); default 143771 MiB");
  replay->add_flag("--min-capacity", ra.min_capacity,
                   "Binary-search the smallest capacity that replays without out-of-memory");
  replay->add_option("--config", ra.config,
                     "Allocator options, key:value,... (default: $CUARENA_CONF)");
  replay->add_option("--json", ra.json, "Also write the results as JSON to this file");

  std::string conv_in, conv_out;
  CLI::App* convert = app.add_subcommand("convert", "Convert a trace to the compact .cuat format");
  convert->add_option("input", conv_in, "Trace file")->required();
  convert->add_option("output", conv_out, "Output .cuat file")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "cuarena: error: " << e.what() << " (run 'cuarena --help')\n";
    return 2;
  }
  try {
    if (*replay) return run_replay(ra);
    if (*convert) {
      write_cuat(conv_out, load_trace(conv_in));
      return 0;
    }
  } catch (const TraceError& e) {
    std::cerr << "cuarena: error: " << e.what() << '\n';
    return 2;
  } catch (const ConfigError& e) {
    std::cerr << "cuarena: error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cuarena: internal error: " << e.what() << '\n';
    return 3;
  }
  return 0;
}
