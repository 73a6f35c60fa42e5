// `cuarena`: the command-line front end (replay traces, convert them). The replay itself is
// run_replay (replay_command.cpp); the allocators come from allocator_registry.hpp.
#include <CLI/CLI.hpp>
#include <iostream>
#include <limits>
#include <set>

#include "cuarena/errors.hpp"
#include "cuarena/replay/allocator_registry.hpp"
#include "cuarena/replay/gpu_replay.hpp"
#include "cuarena/replay/output.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/replay_command.hpp"
#include "cuarena/replay/trace.hpp"

using namespace cuarena;
using namespace cuarena::replay;

namespace {

// An empty value is a slip (an unset shell variable, a missing word), never "not given".
const CLI::Validator kNotEmpty(
    [](std::string& value) {
      return value.empty() ? std::string("empty value: give one, or leave the option out")
                           : std::string();
    },
    "", "not empty");

// "replay, convert or config".
std::string subcommand_list(CLI::App& app) {
  const std::vector<CLI::App*> subs = app.get_subcommands([](CLI::App*) { return true; });
  std::string out;
  for (std::size_t i = 0; i < subs.size(); ++i)
    out += (i == 0 ? "" : i + 1 == subs.size() ? " or " : ", ") + subs[i]->get_name();
  return out;
}

// The first word that is not an option must be a subcommand (the top level's options take no
// values). CLI11 says only "A subcommand is required" for a misspelt one: name it. "" when fine.
std::string subcommand_problem(CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "-h" || arg == "--help" || arg == "--version") return "";
    if (!arg.empty() && arg[0] == '-') continue;  // CLI11 reports an unknown option
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (sub->get_name() == arg) return "";
    return "unknown subcommand '" + clip(arg) + "': give " + subcommand_list(app);
  }
  return "a subcommand is required: " + subcommand_list(app);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  // Every error is one line, the user's arguments in it clipped and escaped.
  auto error = [&args](const std::string& message, const char* tail = "") {
    std::cerr << "cuarena: error: " << error_line(message, args) << tail << '\n';
  };
  CLI::App app{"cuarena: a CUDA caching allocator, and the tools to measure it"};
  app.set_version_flag("--version", std::string("cuarena ") + CUARENA_VERSION);
  app.require_subcommand(1);
  ReplayArgs ra;
  CLI::App* replay = app.add_subcommand(
      "replay",
      "Replay allocation traces (PyTorch snapshots .pickle[.gz], RMM CSV, .cuat) "
      "through the recorded allocator, cuarena and, on a GPU, the alternatives");
  replay
      ->add_option("TRACE", ra.traces,
                   "Trace files, told apart by content (gzipped or not); one bad file is "
                   "reported and the others replayed (exit 2)")
      ->required()
      ->check(kNotEmpty);
  const std::vector<std::string> names = allocator_names();
  replay->add_option("--allocator", ra.allocators, allocator_help())
      ->delimiter(',')
      ->check(kNotEmpty)
      ->check(CLI::IsMember(std::set<std::string>(names.begin(), names.end())));
  replay
      ->add_option("--backend", ra.backends,
                   "Where rows replay: sim (the simulated device: cuarena and the torch-*-sim "
                   "models; the default), cuda (this machine's GPU: every GPU row), or sim,cuda")
      ->delimiter(',')
      ->check(kNotEmpty)
      ->check(CLI::IsMember({"sim", "cuda"}));
  replay
      ->add_option("--capacity", ra.capacity,
                   "Simulated device capacity for the sim rows (GPU rows ignore it): 80GiB, "
                   "512MiB (powers of 1024), 80GB (powers of 1000) or bytes, one granule to "
                   "16TiB; overrides sim_capacity (default: cuarena 143771 MiB, the "
                   "torch-*-sim rows no limit); prints a verdict per row")
      ->check(kNotEmpty);
  replay->add_flag("--min-capacity", ra.min_capacity,
                   "Binary-search the smallest capacity (a multiple of 2 MiB) that replays "
                   "without out-of-memory: sim: cuarena (its answer checked by replays above "
                   "it) and the torch-*-sim rows; cuda: every GPU row, held to each probed "
                   "limit (one full replay per probe, slow)");
  replay->add_flag("--check", ra.check,
                   "Exit 1 when a replayed allocator runs out of memory (the recorded row does "
                   "not count); prints the verdicts as --capacity does");
  replay->add_flag("--verify", ra.verify,
                   "GPU (needs --backend cuda): tag every block with a kernel and check the tag "
                   "before it is freed");
  replay->add_option("--device", ra.device, "GPU: CUDA device ordinal (default 0)")
      ->check(kNotEmpty)
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  replay
      ->add_option("--gpu-lag", ra.gpu_lag,
                   "GPU: keep the device about N trace events behind the host, as a job's "
                   "kernels do (a busy kernel of 20 us per event on its stream; the replay takes "
                   "that much longer): the GPU counterpart of --config sim_event_latency:N "
                   "(default 0: no kernels, and the device keeps up)")
      ->check(kNotEmpty)
      ->check(CLI::Range(std::uint64_t{0}, kMaxGpuLag));
  std::string config_text;
  CLI::Option* config_option = replay->add_option(
      "--config", config_text,
      "cuarena's options and the simulator's sim_* keys, key:value,... (default: "
      "$CUARENA_CONF; --config '' gives the defaults, ignoring $CUARENA_CONF; the keys: "
      "'cuarena config')");
  replay
      ->add_option("--torch-conf", ra.torch_conf,
                   "Settings of the torch-*-sim rows (name one in --allocator) in "
                   "PYTORCH_CUDA_ALLOC_CONF syntax: max_split_size_mb, "
                   "max_non_split_rounding_mb, roundup_power2_divisions, "
                   "garbage_collection_threshold (acts only under --capacity or sim_capacity), "
                   "expandable_segments (must agree with the rows' names)")
      ->check(kNotEmpty);
  replay
      ->add_option("--json", ra.json,
                   "Also write the results as JSON to this file ({\"results\": [...]}), whole "
                   "or not at all (a failed write leaves an earlier file as it was)")
      ->check(kNotEmpty);
  replay->add_flag("--series", ra.series,
                   "With --json: add each row's reserved and requested bytes over the replay "
                   "(at most 2000 points, each the largest of its window of events)");
  replay
      ->add_option("--report", ra.report,
                   "Draw reserved and requested memory over the replay for every row, peaks "
                   "marked (needs matplotlib): PATH.png, or PATH.html with the table beside it")
      ->check(kNotEmpty);

  replay->add_flag("--publish", ra.publish,
                   "Show the cuarena sim row to `cuarena top` while it replays: a monitor page "
                   "for the trace's device, its total the simulated capacity");
  replay->add_option("--pace", ra.pace_us,
                     "Sleep this many microseconds before each event of the cuarena sim row, so "
                     "that a replay can be watched (with --publish)");

  std::string conv_in, conv_out;
  CLI::App* convert = app.add_subcommand("convert", "Convert a trace to the compact .cuat format");
  convert->add_option("input", conv_in, "Trace file")->required()->check(kNotEmpty);
  convert
      ->add_option("output", conv_out,
                   "Output .cuat file, written whole or not at all (a failed write leaves an "
                   "earlier file as it was)")
      ->required()
      ->check(kNotEmpty);

  bool markdown = false;
  CLI::App* config = app.add_subcommand(
      "config", "List the keys of --config and CUARENA_CONF: key:value of the defaults");
  config->add_flag("--markdown", markdown,
                   "Print the keys as a Markdown table (defaults, values, meaning), as README.md "
                   "has it");

  if (const std::string why = subcommand_problem(app, args); !why.empty()) {
    error(why, " (run 'cuarena --help')");
    return 2;
  }
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
    error(e.what(), " (run 'cuarena --help')");
    return 2;
  }
  if (config_option->count() > 0) ra.config = config_text;
  try {
    if (*replay) return run_replay(ra);
    if (*config) {
      if (markdown)
        std::cout << config_markdown_table();
      else
        std::cout << Config{}.to_string() << ',' << config_string(SimConfig::table(), SimConfig{})
                  << '\n';
      return 0;
    }
    if (*convert) {
      const std::vector<Event> events = load_trace(conv_in);
      write_output(conv_out, "convert output", [&](const std::string& file, int) {
        // By name: the format library writes `file` whole (through a file of its own beside
        // it, renamed over `file`), or a device directly.
        write_cuat(file, events);
      });
      return 0;
    }
  } catch (const TraceError& e) {
    error(e.what());
    return 2;
  } catch (const ConfigError& e) {
    error(e.what());
    return 2;
  } catch (const std::exception& e) {
    error(e.what());
    return 3;
  }
  return 0;
}
