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
  std::int64_t planned;  // allocations served at their loop-planned offset (config loop_plan)
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
    out.push_back(
        {after.map_calls - before.map_calls, after.unmap_calls - before.unmap_calls,
         after.access_calls - before.access_calls, after.num_device_alloc - before.num_device_alloc,
         after.num_device_free - before.num_device_free,
         (after.granules_stolen + after.granules_aliased) -
             (before.granules_stolen + before.granules_aliased),
         after.reserved_bytes[all].peak, after.reserved_bytes[all].current,
         after.allocated_bytes[all].current, p == 0 ? 0 : same, allocations,
         after.planned_allocations - before.planned_allocations, alloc.memory_breakdown()});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Per-pass driver calls and reserved memory of cuarena in a training loop built "
      "from a trace (simulator)"};
  std::vector<std::string> traces;
  int passes = 10;
  std::string config, json_path;
  app.add_option("TRACE", traces, "Trace files (PyTorch snapshots, .cuat)")->required();
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
      std::printf("%s (device %u, %zu ops in pass 1, %zu per later pass, %.1f MiB never freed)\n",
                  replay::trace_name(path).c_str(), unsigned(device), ops.first.size(),
                  ops.loop.size(), double(ops.long_lived_bytes) / (1 << 20));
      std::printf("%5s %8s %8s %8s %8s %8s %9s %14s %14s %9s %9s\n", "pass", "maps", "unmaps",
                  "access", "creates", "releases", "moved", "reserved peak", "reserved end",
                  "same addr", "planned");
      nlohmann::json rows = nlohmann::json::array();
      for (std::size_t i = 0; i < figures.size(); ++i) {
        const PassFigures& f = figures[i];
        std::printf("%5zu %8lld %8lld %8lld %8lld %8lld %9lld %14lld %14lld %9lld %9lld\n", i + 1,
                    (long long)f.maps, (long long)f.unmaps, (long long)f.access,
                    (long long)f.creates, (long long)f.releases, (long long)f.moved,
                    (long long)f.reserved_peak, (long long)f.reserved_end, (long long)f.same_addr,
                    (long long)f.planned);
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
