// `cuarena`: the command-line front end (replay traces, convert them).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "process.hpp"
#include "report.hpp"
#include "torch_sim.hpp"
#ifdef CUARENA_HAVE_CUDA
#include "gpu_capacity.hpp"
#include "gpu_replay.hpp"
#endif

using namespace cuarena;
using namespace cuarena::replay;

namespace {

constexpr const char* kNoCudaSupport =
    "--backend cuda: this build has no CUDA support (no CUDA toolkit at configure time)";

// Every GPU row, in report order.
const std::vector<std::string> kGpuAllocators = {
    "cuarena",     "cuarena-async", "cuarena-malloc", "torch-native", "torch-expandable",
    "torch-async", "cuda-malloc",   "cuda-async",     "cub",          "rmm-pool",
    "rmm-arena"};

bool is_rmm(const std::string& name) { return name.rfind("rmm-", 0) == 0; }

struct ReplayArgs {
  std::vector<std::string> traces;
  std::vector<std::string> allocators;
  std::vector<std::string> backends = {"sim"};
  std::string capacity;
  bool min_capacity = false;
  bool check = false;  // exit 1 when a replayed row runs out of memory
  bool verify = false;
  int device = 0;
  std::string config;
  std::string torch_conf;
  std::string json;
  bool series = false;  // --json gains each row's series
  std::string report;   // --report PATH.html|PATH.png
};

// PyTorch's allocator in a fresh process (it reads PYTORCH_CUDA_ALLOC_CONF once, at load).
std::optional<Result> replay_torch(const std::string& trace, const std::string& mode,
                                   const ReplayArgs& a, bool asked_for) {
  const std::string exe = executable_dir() + "/cuarena_torch_replay";
  if (!std::filesystem::exists(exe)) {
    const std::string why = mode + ": this build has no PyTorch replayer (configure with "
                                   "-DCUARENA_WITH_TORCH=ON where torch is installed)";
    if (asked_for) throw std::runtime_error(why);
    std::cerr << "cuarena replay: skipped " << why << '\n';
    return std::nullopt;
  }
  const std::string conf = mode == "torch-expandable" ? "expandable_segments:True"
                           : mode == "torch-async"    ? "backend:cudaMallocAsync"
                                                      : "";
  char tmpl[] = "/tmp/cuarena-torch-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) throw TraceError("cannot create a temporary file");
  close(fd);
  std::vector<std::string> argv = {exe, trace, mode, tmpl, "--device", std::to_string(a.device)};
  if (a.verify) argv.push_back("--verify");
  if (a.min_capacity) argv.push_back("--min-capacity");
  if (a.series || !a.report.empty()) argv.push_back("--series");
  std::string err;
  const int rc = run_process(argv, {"PYTORCH_CUDA_ALLOC_CONF=" + conf}, err);
  if (rc != 0) {
    std::remove(tmpl);
    // PyTorch's errors read "what():  <message>"; otherwise the first line says most.
    std::string why = err.substr(0, err.find('\n'));
    const std::size_t what = err.find("what():");
    if (what != std::string::npos) why = err.substr(what + 7, err.find('\n', what) - what - 7);
    throw std::runtime_error(trace + ": " + mode + " replay failed (exit " + std::to_string(rc) +
                             "):" + why);
  }
  auto results = read_json(tmpl);
  std::remove(tmpl);
  return results.at(0);
}

#ifdef CUARENA_HAVE_CUDA
// --min-capacity for an in-process GPU row: each probe builds the allocator held to the limit.
std::optional<std::uint64_t> gpu_row_min_capacity(const std::string& trace,
                                                  const std::vector<Event>& events,
                                                  const std::string& allocator, const Result& r,
                                                  int device, const Config& config) {
  if (r.ooms > 0) {
    std::cerr << "cuarena replay: " << trace << ": " << allocator
              << ": no min capacity: it ran out of memory even without a limit\n";
    return std::nullopt;
  }
  auto fits = [&](std::uint64_t limit) {
    std::unique_ptr<GpuAllocator> held;
    try {
      held = make_gpu_allocator(allocator, device, config, limit);
    } catch (const OutOfMemoryError&) {  // the limit cannot even be set up (rmm-arena)
      return false;
    }
    return replays_within(events, *held, device);
  };
  auto found = gpu_min_capacity(events, device, r.peak_reserved_bytes, fits);
  if (!found)
    std::cerr << "cuarena replay: " << trace << ": " << allocator
              << ": no min capacity: no limit up to the device's memory replays it\n";
  return found;
}
#endif

std::optional<Result> replay_one_gpu(const std::string& path, const std::vector<Event>& events,
                                     const std::string& allocator, const ReplayArgs& a,
                                     const Config& config, bool asked_for) {
  if (allocator.rfind("torch-", 0) == 0) return replay_torch(path, allocator, a, asked_for);
#ifdef CUARENA_HAVE_CUDA
  GpuReplayOptions options;
  options.verify = a.verify;
  options.device = a.device;
  options.series = !a.report.empty() || a.series;
  Result r;
  {  // destroyed before the capacity search, so its memory is back on the device
    std::unique_ptr<GpuAllocator> impl = make_gpu_allocator(allocator, a.device, config);
    r = replay_gpu(events, *impl, options);
  }
  if (a.min_capacity)
    r.min_capacity_bytes = gpu_row_min_capacity(path, events, allocator, r, a.device, config);
  return r;
#else
  (void)path, (void)events, (void)config, (void)asked_for;
  throw ConfigError(kNoCudaSupport);
#endif
}

// --min-capacity for cuarena on the simulator: the search, checked above its answer; a probe
// there that fails is a note (the reported figure is then above every failing probe).
void sim_min_capacity(Result& r, const std::vector<Event>& ev, const SimOptions& sim,
                      Notes& notes, const std::string& trace, const std::string& label) {
  const CheckedMinCapacity m = min_capacity_checked(ev, sim, r.peak_reserved_bytes);
  r.min_capacity_bytes = m.bytes.value_or(0);  // 0: nothing up to 2^50 bytes fits, as before
  r.min_capacity_search_bytes = m.searched;
  r.min_capacity_probes = m.probes;
  if (m.bytes == m.searched) return;
  const CapacityProbe* worst = nullptr;  // the largest failing probe
  for (const CapacityProbe& p : m.probes)
    if (p.ooms > 0 && (!worst || p.capacity_bytes > worst->capacity_bytes)) worst = &p;
  notes.add(trace, label,
            r.allocator + ": the capacity search found " + format_bytes(*m.searched) + ", but " +
                format_bytes(worst->capacity_bytes) + " (above it) runs out of memory (" +
                std::to_string(worst->ooms) +
                (worst->ooms == 1 ? " failed allocation): " : " failed allocations): ") +
                (m.bytes ? "min capacity " + format_bytes(*m.bytes) +
                               ", the smallest capacity above which every probe fits"
                         : std::string("no capacity up to 1 PiB fits above it")) +
                " (min_capacity_probes in the JSON)");
}

int run_replay(ReplayArgs a) {
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
  if (!a.capacity.empty()) {
    sim.capacity = parse_size(a.capacity, "--capacity");
    if (sim.capacity < sim.config.sim_granularity)
      throw ConfigError("--capacity " + a.capacity + " is smaller than one granule");
    if (sim.capacity > kMaxDeviceBytes)
      throw ConfigError("--capacity " + a.capacity + " is larger than any device (at most 16TiB)");
  }
  const bool gpu = std::find(a.backends.begin(), a.backends.end(), "cuda") != a.backends.end();
  const bool on_sim = std::find(a.backends.begin(), a.backends.end(), "sim") != a.backends.end();
  const bool explicit_allocators = !a.allocators.empty();
  if (a.allocators.empty()) {
    a.allocators = {"recorded", "cuarena"};
    if (gpu) {
      for (const auto& name : kGpuAllocators)
        if (name != "cuarena") a.allocators.push_back(name);
    }
  }
  for (const auto& name : a.allocators) {
    if (is_torch_sim(name) && !on_sim)
      throw ConfigError("--allocator " + name + " needs --backend sim");
    if (name != "recorded" && name != "cuarena" && !is_torch_sim(name) && !gpu)
      throw ConfigError("--allocator " + name + " needs --backend cuda");
  }
  check_torch_conf(a.torch_conf, a.allocators);
  sim.torch_conf = a.torch_conf;
  if (a.verify && !gpu) throw ConfigError("--verify needs --backend cuda (it tags real memory)");
  if (gpu) {
#ifdef CUARENA_HAVE_CUDA
    const std::string why = gpu_unavailable_reason(a.device);
    if (!why.empty()) throw ConfigError("--backend cuda: " + why);
    const std::string no_rmm = rmm_unavailable_reason();
    if (!no_rmm.empty()) {  // asked for: an error; by default: one note, and the rows go
      std::vector<std::string> kept, dropped;
      for (const auto& name : a.allocators) (is_rmm(name) ? dropped : kept).push_back(name);
      if (!dropped.empty() && explicit_allocators)
        throw ConfigError("--allocator " + dropped[0] + ": " + no_rmm);
      if (!dropped.empty()) {
        std::cerr << "cuarena replay: " << dropped[0];
        for (std::size_t i = 1; i < dropped.size(); ++i) std::cerr << ", " << dropped[i];
        std::cerr << ": skipped: " << no_rmm << '\n';
      }
      a.allocators = kept;
    }
#else
    throw ConfigError(kNoCudaSupport);
#endif
  }
  if (a.series && a.json.empty())
    throw ConfigError("--series adds the time series to the JSON: give --json FILE too");
  sim.series = a.series || !a.report.empty();
  if (!a.json.empty()) {
    // Fail now, not after a long replay, if the JSON cannot be written, without creating it:
    // a run that fails leaves no empty results file behind.
    std::error_code ec;
    const std::filesystem::path json(a.json);
    if (std::filesystem::is_directory(json, ec))
      throw ConfigError("--json " + a.json + " is a directory; give a file name such as " +
                        (json / "results.json").string());
    const std::string dir = json.has_parent_path() ? json.parent_path().string() : ".";
    const bool exists = std::filesystem::exists(json, ec);
    if (::access(exists ? a.json.c_str() : dir.c_str(), W_OK) != 0)
      throw ConfigError("--json " + a.json + ": cannot write " + (exists ? "it" : "in " + dir) +
                        ": " + std::strerror(errno));
  }
  // The same for the report, and that matplotlib is there to draw it.
  if (!a.report.empty()) check_report(a.report);
  // Load everything first, so a bad file is reported before any long replay; the others are
  // still replayed and the exit status is 2 at the end.
  std::vector<std::pair<std::string, std::vector<Event>>> traces;
  bool bad_input = false;
  for (const std::string& path : a.traces) {
    try {
      traces.emplace_back(path, load_trace(path));
    } catch (const TraceError& e) {
      std::cerr << "cuarena: error: " << e.what() << '\n';
      bad_input = true;
    }
  }
  if (traces.empty()) return 2;  // nothing to replay: no table, no JSON

  std::vector<Result> results;
  bool failures = false;
  Notes notes;  // per-device notes, one line per trace and text (flushed after each trace)
  for (const auto& [path, events] : traces) {
    const auto by_device = split_by_device(events);  // one pass, however many devices
    if (by_device.empty()) std::cerr << "cuarena replay: " << path << ": the trace has no events\n";
    for (const auto& [device, ev] : by_device) {
      const bool one = by_device.size() == 1 && device == 0;
      const std::string label = one ? "" : "cuda" + std::to_string(device);
      std::string name = trace_name(path);
      if (!one) name += ":" + label;
      for (const std::string& allocator : a.allocators) {
        std::vector<std::optional<Result>> rows;
        if (allocator == "recorded") {
          if (std::none_of(ev.begin(), ev.end(), [](const Event& e) {
                return e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap;
              })) {
            notes.add(trace_name(path), label,
                      "no 'recorded' row: the trace has no segment events (RMM logs and "
                      "cuarena recordings do not hold the upstream's reservations)");
          } else {
            rows.push_back(replay_recorded(ev, sim.series));
          }
        } else {
          if (allocator == "cuarena" && on_sim) {
            Result r = replay_cuarena(ev, sim);
            if (a.min_capacity) sim_min_capacity(r, ev, sim, notes, trace_name(path), label);
            rows.push_back(std::move(r));
          }
          if (is_torch_sim(allocator))  // CPU models of PyTorch's allocator, on the simulator
            rows.push_back(replay_torch_sim_row(allocator, ev, sim, a.min_capacity));
          if (gpu && !is_torch_sim(allocator)) {
            try {
              rows.push_back(replay_one_gpu(path, ev, allocator, a, sim.config, explicit_allocators));
            } catch (const std::runtime_error& e) {  // report, go on with the other allocators
              std::cerr << "cuarena: error: " << e.what() << '\n';
              failures = true;
            }
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
  if (!a.capacity.empty() || a.check) {
    for (Result& r : results) {
      if (r.allocator == "recorded") r.capacity_bytes = sim_capacity_bytes(sim);
      else out_of_memory = out_of_memory || r.ooms > 0;
      r.verdict = verdict(r);
    }
  }
  print_table(std::cout, results);
  if (!a.capacity.empty() || a.check) {
    std::cout << '\n';
    print_verdicts(std::cout, results);
  }
  if (!a.json.empty()) write_json(a.json, results, a.series);
  if (!a.report.empty()) write_report(a.report, results);
  if (bad_input) return 2;  // bad input outranks a failed replay
  return failures || (a.check && out_of_memory) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cuarena: a CUDA caching allocator, and the tools to measure it"};
  app.set_version_flag("--version", std::string("cuarena ") + CUARENA_VERSION);
  app.require_subcommand(1);
  ReplayArgs ra;
  CLI::App* replay = app.add_subcommand(
      "replay", "Replay allocation traces (PyTorch snapshots .pickle[.gz], RMM CSV, .cuat) "
                "through the recorded allocator, cuarena and, on a GPU, the alternatives");
  replay->add_option("TRACE", ra.traces, "Trace files")->required();
  std::set<std::string> allocator_names = {"recorded"};
  allocator_names.insert(kGpuAllocators.begin(), kGpuAllocators.end());
  allocator_names.insert({"torch-native-sim", "torch-expandable-sim"});
  replay
      ->add_option("--allocator", ra.allocators,
                   "Allocators: recorded, cuarena; on --backend sim also torch-native-sim, "
                   "torch-expandable-sim (CPU models of PyTorch's allocator); with --backend cuda "
                   "also cuarena-async, "
                   "cuarena-malloc (cuarena over upstream async / malloc; cuarena uses the "
                   "configured upstream), torch-native, torch-expandable, torch-async (PyTorch, "
                   "if built with it), cuda-malloc, cuda-async, cub, rmm-pool, rmm-arena (if "
                   "built with RMM) (default: all that apply)")
      ->delimiter(',')
      ->check(CLI::IsMember(allocator_names));
  replay
      ->add_option("--backend", ra.backends,
                   "Device: sim (cuarena on a simulated device, default), cuda (every allocator "
                   "on this machine's GPU), or both")
      ->delimiter(',')
      ->check(CLI::IsMember({"sim", "cuda"}));
  replay->add_option("--capacity", ra.capacity,
                     "Device capacity for the simulator (80GiB, 512MiB, bytes); default 143771 MiB");
  replay->add_flag("--min-capacity", ra.min_capacity,
                   "Binary-search the smallest capacity (a multiple of 2 MiB) that replays "
                   "without out-of-memory: sim: cuarena on the simulator; cuda: every GPU row, "
                   "held to each probed limit (one full replay per probe, slow)");
  replay->add_flag("--check", ra.check,
                   "Exit 1 when a replayed allocator runs out of memory (the recorded row does "
                   "not count); prints the verdicts as --capacity does");
  replay->add_flag("--verify", ra.verify,
                   "GPU: tag every block with a kernel and check the tag before it is freed");
  replay->add_option("--device", ra.device, "GPU: CUDA device ordinal (default 0)");
  replay->add_option("--config", ra.config,
                     "Allocator options, key:value,... (default: $CUARENA_CONF)");
  replay->add_option("--torch-conf", ra.torch_conf,
                     "Settings of the torch-*-sim rows in PYTORCH_CUDA_ALLOC_CONF syntax: "
                     "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
                     "garbage_collection_threshold (needs --capacity), expandable_segments");
  replay->add_option("--json", ra.json, "Also write the results as JSON to this file");
  replay->add_flag("--series", ra.series,
                   "With --json: add each row's reserved and requested bytes over the replay "
                   "(at most 2000 points, each the largest of its window of events)");
  replay->add_option("--report", ra.report,
                     "Draw reserved and requested memory over the replay for every row, peaks "
                     "marked (needs matplotlib): PATH.png, or PATH.html with the table beside it");

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
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << '\n';
    return 0;
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
    std::cerr << "cuarena: error: " << e.what() << '\n';
    return 3;
  }
  return 0;
}
