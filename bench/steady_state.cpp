// cuarena_steady_state: does the policy converge in a training loop? Deterministic figures (driver
// calls, bytes) per pass, on the simulator.
//
//   cuarena_steady_state TRACE... [--passes N] [--config key:value,...] [--json FILE]
//
// --config takes the core's keys and the simulator's (sim_event_latency: how many events after
// its record a sweep event completes, the device's lag; sim_capacity, sim_granularity), as
// `cuarena replay --config` does.
//
// Pass 1 replays the whole trace (first device) except that blocks it never frees stay allocated,
// as weights and optimizer state do in a training loop. Each later pass replays only the blocks
// the trace both allocates and frees, in trace order, with fresh addresses (whatever cuarena
// hands out), while those long-lived blocks stay. Per pass: cuarena's driver calls (map, unmap,
// set-access, physical creates and releases), granules moved, and reserved bytes (peak within
// the pass, and at its end), and how many allocations landed at the address the same block had
// one pass before (a layout that repeats finds its mappings in place); the JSON adds where the
// reserved memory is at each pass's end (Allocator::memory_breakdown: end_in_use_bytes,
// end_owned_cached_bytes, end_shared_cached_bytes, end_retired_bytes, end_idle_bytes; all but
// retired add up to reserved_end_bytes). A converged policy makes
// zero driver calls per pass after a few warm-up passes and its reserved peak stops rising. Frees
// are made at free_completed, with the simulated clock ticking once per event, as BM_MixedSizes
// does; lost frees are handled as the replayer's loop handles them
// (cuarena/replay/replay_loop.hpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/config.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"
#include "cuarena/sim_backend.hpp"
#include "trace_ops.hpp"

namespace {

namespace replay = cuarena::replay;

struct Op {
  bool alloc;
  std::uint32_t block;  // dense block number, one per alloc event
  std::uint64_t stream;
  std::uint64_t size;
};

struct LoopOps {
  std::vector<Op> first;  // pass 1: every alloc and in-trace free
  std::vector<Op> loop;   // later passes: the ops of blocks the trace frees
  std::uint32_t blocks = 0;
  std::uint64_t long_lived_bytes = 0;  // requested bytes of blocks never freed
};

LoopOps compile(const std::vector<replay::Event>& events) {
  const cuarena::bench::FlatTrace flat = cuarena::bench::flatten_trace(events);
  LoopOps out;
  out.blocks = flat.blocks;
  std::vector<bool> freed(flat.blocks, false);
  for (const cuarena::bench::FlatOp& op : flat.ops) {
    if (!op.alloc) freed[op.block] = true;
    // Frees carry stream 0: run() queues every op's work on its stream, a free's on the default.
    out.first.push_back({op.alloc, op.block, op.alloc ? op.stream : 0, op.size});
  }
  for (const Op& op : out.first) {
    if (freed[op.block])
      out.loop.push_back(op);
    else if (op.alloc)
      out.long_lived_bytes += op.size;
  }
  return out;
}

struct PassFigures {
  std::int64_t maps, unmaps, access, creates, releases, moved;
  std::int64_t reserved_peak, reserved_end, allocated_end;
  std::int64_t same_addr;  // allocations placed where the same block was one pass before
  std::int64_t allocations;
  std::int64_t planned;       // allocations served at their loop-planned offset (config loop_plan)
  std::int64_t stream_waits;  // planned allocations' streams made to wait for another's free
  std::int64_t requested_peak;  // most bytes requested and live at once during the pass
  cuarena::Allocator::MemoryBreakdown at_end;  // where the reserved memory is after the pass
};

std::vector<PassFigures> run(const LoopOps& ops, const replay::SimOptions& options, int passes) {
  cuarena::SimBackend sim(replay::sim_backend_options(options));
  cuarena::Allocator alloc(sim, options.config);
  std::vector<void*> ptr(ops.blocks, nullptr);
  std::vector<void*> last(ops.blocks, nullptr);  // each block's address one pass before
  std::vector<PassFigures> out;
  const int all = static_cast<int>(cuarena::Pool::kAll);
  for (int p = 0; p < passes; ++p) {
    const cuarena::Stats before = alloc.stats();
    alloc.reset_peak_stats();
    std::int64_t same = 0, allocations = 0;
    for (const Op& op : p == 0 ? ops.first : ops.loop) {
      sim.advance(1);
      sim.queue_work(op.stream);
      if (op.alloc) {
        ptr[op.block] = alloc.allocate(op.size, op.stream);
        ++allocations;
        if (ptr[op.block] == last[op.block]) ++same;
        last[op.block] = ptr[op.block];
      } else
        alloc.deallocate(ptr[op.block]);
    }
    alloc.check_invariants();
    const cuarena::Stats after = alloc.stats();
    out.push_back({after.map_calls - before.map_calls, after.unmap_calls - before.unmap_calls,
                   after.access_calls - before.access_calls,
                   after.num_device_alloc - before.num_device_alloc,
                   after.num_device_free - before.num_device_free,
                   (after.granules_stolen + after.granules_aliased) -
                       (before.granules_stolen + before.granules_aliased),
                   after.reserved_bytes[all].peak, after.reserved_bytes[all].current,
                   after.allocated_bytes[all].current, p == 0 ? 0 : same, allocations,
                   after.planned_allocations - before.planned_allocations,
                   after.stream_waits - before.stream_waits, after.requested_bytes[all].peak,
                   alloc.memory_breakdown()});
  }
  return out;
}

// The table's columns, in order: its header and --help read this one list.
struct Column {
  const char* name;
  const char* meaning;
};
constexpr Column kColumns[] = {
    {"pass", "1 replays the whole trace; each later pass only the blocks the trace frees"},
    {"maps", "map calls, each mapping a run of granules (cuMemMap on a GPU)"},
    {"unmaps", "unmap calls (cuMemUnmap)"},
    {"access", "set-access calls, one for one or more maps (cuMemSetAccess)"},
    {"creates", "physical chunks created (cuMemCreate; with upstream:async or malloc, segments)"},
    {"releases", "physical chunks released (cuMemRelease; or segments freed)"},
    {"moved",
     "granules mapped at a new address: cached granules taken from other free blocks "
     "(stolen) plus a stream's own free granules mapped again for it (aliased)"},
    {"reserved peak", "most physical memory cuarena held during the pass"},
    {"reserved end", "physical memory cuarena held at the end of the pass"},
    {"same addr",
     "allocations placed at the address the same block had one pass before (always 0 in "
     "pass 1)"},
    {"planned", "allocations served at their loop-planned offset (only with loop_plan:True)"},
};

// `text` in lines of at most 100 characters, each after `indent` spaces.
std::string wrap(const std::string& text, std::size_t indent) {
  std::string out, line;
  std::size_t from = 0;
  while (from < text.size()) {
    std::size_t to = text.find(' ', from);
    if (to == std::string::npos) to = text.size();
    const std::string word = text.substr(from, to - from);
    if (!line.empty() && indent + line.size() + 1 + word.size() > 100) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    from = to + 1;
  }
  return out + std::string(indent, ' ') + line + "\n";
}

std::string columns_help() {
  std::string out = wrap(
      "Output: per trace, a line naming it, the device replayed (the trace's first), the "
      "allocations and frees of pass 1 and of each later pass, and the requested bytes never "
      "freed; then one row per pass:",
      0);
  for (const Column& c : kColumns) {  // each name fits in the 15 columns before its meaning
    std::string item = wrap(c.meaning, 17);
    item.replace(2, std::string(c.name).size(), c.name);
    out += item;
  }
  return out + "\n" +
         wrap(
             "Driver calls are the simulator's count of those a GPU would make. Sizes are in B, "
             "KiB, MiB, GiB or TiB (powers of 1024) with two decimals, as 'cuarena replay' "
             "prints them; --json gives every figure in bytes, plus allocated_end_bytes, "
             "allocations, requested_peak_bytes, stream_waits (planned allocations' streams made "
             "to wait on the device for another stream's free) and where the reserved memory is at "
             "each "
             "pass's end (end_*_bytes).",
             0);
}

// One row per pass, aligned as `cuarena replay` prints its table: right-aligned columns two
// spaces apart, a dashed rule under the header.
void print_table(const std::vector<PassFigures>& figures) {
  std::vector<std::vector<std::string>> rows(1);
  for (const Column& c : kColumns) rows[0].push_back(c.name);
  for (std::size_t i = 0; i < figures.size(); ++i) {
    const PassFigures& f = figures[i];
    auto n = [](std::int64_t v) { return std::to_string(v); };
    auto bytes = [](std::int64_t v) { return cuarena::format_bytes(std::size_t(v)); };
    rows.push_back({std::to_string(i + 1), n(f.maps), n(f.unmaps), n(f.access), n(f.creates),
                    n(f.releases), n(f.moved), bytes(f.reserved_peak), bytes(f.reserved_end),
                    n(f.same_addr), n(f.planned)});
  }
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string line;
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      if (c) line += "  ";
      line += std::string(width[c] - rows[i][c].size(), ' ') + rows[i][c];
    }
    std::printf("%s\n", line.c_str());
    if (i == 0) std::printf("%s\n", std::string(line.size(), '-').c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Per-pass driver calls and reserved memory of cuarena in a training loop built "
      "from a trace (simulator)"};
  std::vector<std::string> traces;
  int passes = 10;
  std::string config, json_path;
  app.footer(columns_help());
  app.add_option("TRACE", traces,
                 "Trace files: PyTorch snapshots, RMM logging_resource_adaptor CSVs, .cuat; "
                 "gzipped or not (docs/formats.md)")
      ->required();
  app.add_option("--passes", passes, "Passes, the first one included")->check(CLI::Range(2, 1000));
  app.add_option("--config", config,
                 "Allocator options and the simulator's sim_* keys (sim_event_latency: the "
                 "device's lag in events), key:value,...");
  app.add_option("--json", json_path, "Also write the figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  replay::SimOptions options;
  try {
    replay::parse_replay_config(config, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena_steady_state: --config: %s\n", e.what());
    return 1;
  }
  nlohmann::json doc = nlohmann::json::array();
  int status = 0;
  for (const std::string& path : traces) {
    try {
      const auto devices = replay::split_by_device(replay::load_trace(path));
      if (devices.empty()) throw replay::TraceError(path + ": no events");
      const auto& [device, events] = devices.front();
      const LoopOps ops = compile(events);
      const std::vector<PassFigures> figures = run(ops, options, passes);
      std::printf("%s%s (device %u, %zu ops in pass 1, %zu per later pass, %s never freed)\n",
                  doc.empty() ? "" : "\n", replay::trace_name(path).c_str(), unsigned(device),
                  ops.first.size(), ops.loop.size(),
                  cuarena::format_bytes(ops.long_lived_bytes).c_str());
      print_table(figures);
      nlohmann::json rows = nlohmann::json::array();
      for (std::size_t i = 0; i < figures.size(); ++i) {
        const PassFigures& f = figures[i];
        rows.push_back({{"pass", i + 1},
                        {"map_calls", f.maps},
                        {"unmap_calls", f.unmaps},
                        {"access_calls", f.access},
                        {"device_allocs", f.creates},
                        {"device_frees", f.releases},
                        {"granules_moved", f.moved},
                        {"reserved_peak_bytes", f.reserved_peak},
                        {"reserved_end_bytes", f.reserved_end},
                        {"allocated_end_bytes", f.allocated_end},
                        {"allocations", f.allocations},
                        {"same_address_allocations", f.same_addr},
                        {"planned_allocations", f.planned},
                        {"stream_waits", f.stream_waits},
                        {"requested_peak_bytes", f.requested_peak},
                        {"end_in_use_bytes", f.at_end.in_use},
                        {"end_owned_cached_bytes", f.at_end.owned_cached},
                        {"end_shared_cached_bytes", f.at_end.shared_cached},
                        {"end_retired_bytes", f.at_end.retired},
                        {"end_idle_bytes", f.at_end.idle}});
      }
      doc.push_back({{"trace", replay::trace_name(path)},
                     {"config", config},
                     {"long_lived_requested_bytes", ops.long_lived_bytes},
                     {"passes", rows}});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cuarena_steady_state: %s\n", e.what());
      status = 1;
    }
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << doc.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "cuarena_steady_state: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return status;
}
