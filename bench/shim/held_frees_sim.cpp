// held_frees_sim: what holding synchronous frees until a fence (shim/src/held_frees.hpp) costs
// in memory and gains in fences, on a recorded job, on the CPU: the trace's allocations and
// frees replayed as the shim serves an uncached PyTorch job (every allocation and free
// synchronous, on the legacy stream) through the allocator on the SimBackend, for several
// limits on the bytes held. As DeviceState::allocate, the shim fences when an allocation cannot
// be served by a block already mapped (Allocator::allocate_cached) at most --snug times its
// size, or by a larger one while a held block would fit within that, and when the limit is
// held; "0" is a fence at every free (reuse at once). Deterministic: fences and bytes, no time.
//
//   build/bin/cuarena_held_frees_sim tests/data/traces/jobs/gpt2.pickle.gz [--config KEYS]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/config.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"
#include "cuarena/sim_backend.hpp"
#include "trace_ops.hpp"

namespace {

using namespace cuarena;
constexpr std::size_t kShimDefaultLimit = 1 * GiB;  // ShimConfig::pending_free_bytes
// ShimConfig::parse's defaults for the core's keys (checked by tests/shim/unit).
constexpr const char* kShimCoreDefaults =
    "wait_before_grow:True,internal_dependencies:False,whole_chunk_max:32MiB,"
    "whole_chunk_min:4MiB,loop_plan:False";

struct Result {
  std::int64_t peak_reserved = 0;
  std::int64_t peak_requested = 0;
  std::uint64_t fences = 0;
  std::uint64_t allocs = 0;
  std::uint64_t served_held = 0;
};

Result run(const bench::FlatTrace& t, const Config& config, std::size_t capacity,
           std::size_t hold_limit, std::size_t snug) {
  SimBackend::Options o;
  o.capacity = capacity;
  SimBackend sim(o);
  Allocator a(sim, config);
  Result r;
  std::vector<void*> ptr(t.blocks, nullptr);
  std::vector<std::uint32_t> held;
  std::size_t held_bytes = 0;
  std::int64_t live = 0;  // what the program holds (a held free is no longer its)
  std::multiset<std::size_t> held_sizes;
  auto fence = [&] {
    if (held.empty()) return;
    ++r.fences;
    for (std::uint32_t b : held) {
      a.deallocate(ptr[b]);
      ptr[b] = nullptr;
    }
    held.clear();
    held_sizes.clear();
    held_bytes = 0;
  };
  for (const bench::FlatOp& op : t.ops) {
    if (op.alloc) {
      ++r.allocs;
      void* p = nullptr;
      if (!held.empty()) {
        p = a.allocate_cached(op.size, 0, snug == 0 ? SIZE_MAX : snug * op.size);
        // No snug block cached: one held may be; if none is, any cached block will do.
        if (p == nullptr && snug != 0) {
          auto it = held_sizes.lower_bound(op.size);
          if (it == held_sizes.end() || *it > snug * op.size) p = a.allocate_cached(op.size, 0);
        }
        if (p != nullptr)
          ++r.served_held;
        else
          fence();
      }
      if (p == nullptr) p = a.allocate(op.size, 0);
      ptr[op.block] = p;
      live += std::int64_t(op.size);
      r.peak_requested = std::max(r.peak_requested, live);
    } else if (ptr[op.block] != nullptr) {
      live -= std::int64_t(op.size);
      held.push_back(op.block);
      held_sizes.insert(op.size);
      held_bytes += op.size;
      if (held_bytes >= hold_limit) fence();
    }
  }
  const Stats s = a.stats();
  r.peak_reserved = s.reserved_bytes[int(Pool::kAll)].peak;
  fence();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Memory and fences of the shim's held frees on a recorded job (CPU)"};
  std::string path, conf;
  double capacity_gib = 141;
  std::size_t snug = 4;
  double check = -1;
  app.add_option("trace", path, "a PyTorch snapshot, .cuat or CSV trace")->required();
  app.add_option("--config", conf,
                 "cuarena keys for the allocator (as CUARENA_CONF), over the shim's defaults "
                 "for the core's keys (" +
                     std::string(kShimCoreDefaults) + ")");
  app.add_option("--capacity-gib", capacity_gib, "simulated device memory, GiB")
      ->check(CLI::PositiveNumber);
  app.add_option("--snug", snug,
                 "while frees are held, a cached block more than this many times the request "
                 "is not split for it (the shim's DeviceState::kSnug; 0: any)");
  app.add_option("--check", check,
                 "exit 1 unless, at the shim's default limit (1 GiB), peak reserved is within "
                 "this fraction of a fence at every free's, with under an eighth of its fences")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const Config config = Config::parse(std::string(kShimCoreDefaults) + "," + conf);
    const auto devices = replay::split_by_device(replay::load_trace(path));
    if (devices.empty()) throw std::runtime_error(path + ": no events");
    const bench::FlatTrace t = bench::flatten_trace(devices.front().second);
    const auto cap = std::size_t(capacity_gib * double(GiB));
    std::printf("%s: %u allocations, snug %zu\n\n", path.c_str(), t.blocks, snug);
    std::printf(
        "| held limit | fences | fences per 1000 allocations | served while held | peak "
        "reserved (GiB) | reserved / the job's peak |\n|---|---|---|---|---|---|\n");
    Result floor, shipped;
    for (const std::size_t limit :
         {std::size_t{0}, 64 * MiB, 256 * MiB, 1 * GiB, 4 * GiB, SIZE_MAX}) {
      const Result r = run(t, config, cap, limit, snug);
      if (limit == 0) floor = r;
      if (limit == kShimDefaultLimit) shipped = r;
      const std::string name = limit == 0          ? "0 (at every free)"
                               : limit == SIZE_MAX ? "none"
                                                   : std::to_string(limit / MiB) + " MiB";
      std::printf(
          "| %s | %llu | %.1f | %llu | %.3f | %.4f |\n", name.c_str(),
          static_cast<unsigned long long>(r.fences), 1000.0 * double(r.fences) / double(r.allocs),
          static_cast<unsigned long long>(r.served_held), double(r.peak_reserved) / double(GiB),
          double(r.peak_reserved) / double(r.peak_requested));
    }
    if (check >= 0) {
      const double over = double(shipped.peak_reserved) / double(floor.peak_reserved) - 1;
      if (over > check || shipped.fences * 8 >= floor.fences) {
        std::fprintf(stderr,
                     "cuarena_held_frees_sim: %s: at the 1 GiB default, peak reserved %+.2f%% "
                     "over a fence at every free (bound %.2f%%), %llu fences against %llu\n",
                     path.c_str(), 100 * over, 100 * check,
                     static_cast<unsigned long long>(shipped.fences),
                     static_cast<unsigned long long>(floor.fences));
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena_held_frees_sim: %s\n", e.what());
    return 2;
  }
  return 0;
}
