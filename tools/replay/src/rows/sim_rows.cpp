// The rows replayed without a GPU: recorded, cuarena on the simulator, the torch-*-sim models.
#include <algorithm>

#include "cuarena/config.hpp"
#include "cuarena/replay/allocator_registry.hpp"
#include "cuarena/replay/torch_sim.hpp"

namespace cuarena::replay {

namespace {

// --min-capacity for cuarena on the simulator: the search, checked above its answer; a probe
// there that fails is a note (the reported figure is then above every failing probe).
void sim_min_capacity(Result& r, const RowContext& c) {
  const CheckedMinCapacity m = min_capacity_checked(c.events, c.sim, r.peak_reserved_bytes);
  r.min_capacity_bytes = m.bytes.value_or(0);  // 0: nothing up to max_sim_capacity() fits
  r.min_capacity_search_bytes = m.searched;
  r.min_capacity_probes = m.probes;
  const std::string ceiling = format_bytes(max_sim_capacity(c.sim.device.granularity));
  if (!m.searched) {
    c.notes.add(c.trace, c.label,
                r.allocator + ": no capacity up to " + ceiling +
                    " (the largest simulated device) replays without out-of-memory");
    return;
  }
  if (m.bytes == m.searched) return;
  const CapacityProbe* worst = nullptr;  // the largest failing probe
  for (const CapacityProbe& p : m.probes)
    if (p.ooms > 0 && (!worst || p.capacity_bytes > worst->capacity_bytes)) worst = &p;
  c.notes.add(c.trace, c.label,
              r.allocator + ": the capacity search found " + format_bytes(*m.searched) + ", but " +
                  format_bytes(worst->capacity_bytes) + " (above it) runs out of memory (" +
                  std::to_string(worst->ooms) +
                  (worst->ooms == 1 ? " failed allocation): " : " failed allocations): ") +
                  (m.bytes ? "min capacity " + format_bytes(*m.bytes) +
                                 ", the smallest capacity above which every probe fits"
                           : "no capacity up to " + ceiling + " fits above it") +
                  " (min_capacity_probes in the JSON)");
}

}  // namespace

std::optional<Result> recorded_row(const std::string&, const RowContext& c) {
  if (std::none_of(c.events.begin(), c.events.end(), [](const Event& e) {
        return e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap;
      })) {
    c.notes.add(c.trace, c.label,
                "no 'recorded' row: the trace has no segment events (RMM logs and "
                "cuarena recordings do not hold the upstream's reservations)");
    return std::nullopt;
  }
  return replay_recorded(c.events, c.sim.series);
}

std::optional<Result> cuarena_sim_row(const std::string&, const RowContext& c) {
  Result r = replay_cuarena(c.events, c.sim);
  if (c.args.min_capacity) sim_min_capacity(r, c);
  return r;
}

std::optional<Result> torch_sim_row(const std::string& allocator, const RowContext& c) {
  return replay_torch_sim_row(allocator, c.events, c.sim, c.args.min_capacity);
}

}  // namespace cuarena::replay
