// Replaying a trace through an allocator and measuring it (metric names from DESIGN.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/config.hpp"
#include "cuarena/replay/trace.hpp"
#include "cuarena/sim_backend.hpp"
#include "cuarena/stats.hpp"

namespace cuarena::replay {

/// One replay of --min-capacity's check: a capacity and the out-of-memory failures under it.
struct CapacityProbe {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t ooms = 0;
};

/// Reserved and requested bytes over one replay (--series, --report), downsampled to at most
/// `max_points` points: point k covers events [k * window, (k + 1) * window) and holds the
/// largest value after any of them, so no peak is lost (the largest reserved value is the row's
/// peak_reserved_bytes, the largest requested its peak_requested_bytes).
struct Series {
  std::uint64_t window = 1;              ///< events per point (the last point may hold fewer)
  std::vector<std::uint64_t> event;      ///< the last event index of each point's window
  std::vector<std::int64_t> time_us;     ///< that event's trace time; empty if the trace has none
  std::vector<std::uint64_t> reserved;   ///< the allocator's reserved bytes, the window's largest
  std::vector<std::uint64_t> requested;  ///< live requested bytes, the window's largest
};

/// Points a series holds at most.
inline constexpr std::size_t kSeriesPoints = 2000;

/// Builds a Series while a replay runs: add() once after each event, in order, with the
/// reserved bytes then; finish() adds the requested bytes and trace times of the same events.
class SeriesRecorder {
 public:
  /// `events`: how many the replay has (the window is ceil(events / max_points)).
  explicit SeriesRecorder(std::size_t events, std::size_t max_points = kSeriesPoints);
  void add(std::uint64_t reserved);
  /// The series of events[0, number of add() calls).
  Series finish(const std::vector<Event>& events);

 private:
  void close_point();
  Series s_;
  std::uint64_t added_ = 0, max_ = 0;
};

struct Result {
  std::string trace;
  std::string allocator;  ///< "recorded" or "cuarena"
  std::string backend;    ///< "trace" for recorded, "sim" for the simulator
  int device = 0;
  std::uint64_t peak_requested_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  double reserved_ratio = 0;
  std::optional<std::uint64_t> min_capacity_bytes;
  /// --min-capacity's check of its answer (checked_min_capacity): the search's own answer and
  /// the capacities above it replayed, with their failures.
  std::optional<std::uint64_t> min_capacity_search_bytes;
  std::vector<CapacityProbe> min_capacity_probes;
  double external_fragmentation = 0;       ///< at the moment of peak reserved
  std::uint64_t free_at_peak_bytes = 0;    ///< reserved but not allocated, at that moment
  std::uint64_t rounding_waste_bytes = 0;  ///< allocated - requested at that moment
  std::uint64_t ooms = 0;
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t skipped_events = 0;  ///< frees of never-seen addresses, unknown actions
  double elapsed_s = 0;
  /// Per-call host latency in microseconds (GPU replays only).
  struct Latency {
    double alloc_p50, alloc_p99, alloc_max, free_p50, free_p99, free_max;
  };
  std::optional<Latency> latency_us;
  std::map<std::string, std::int64_t> counters;  ///< allocator-specific extras
  /// The first allocation that failed (ooms > 0), where the replay knows it.
  struct FirstOom {
    std::uint64_t event = 0;    ///< its index among the device's events (device_traces[d][i])
    std::uint64_t request = 0;  ///< bytes asked for
    /// Free memory then, where the allocator can say: cached inside reserved memory, as
    /// maximal contiguous free pieces, and never reserved (capacity - reserved).
    std::optional<std::uint64_t> cached_free, pieces, largest_piece, unreserved;
  };
  std::optional<FirstOom> first_oom;
  /// The device limit the replay ran under, where one applied (the simulator's capacity
  /// times per_process_memory_fraction); for `recorded`, the capacity it is judged against.
  std::optional<std::uint64_t> capacity_bytes;
  /// One line for people: fits with how much to spare, or where it ran out of memory and what
  /// was free then (verdict() in report.hpp; set with --capacity or --check).
  std::string verdict;
  /// Reserved and requested bytes over the replay, when asked for (the rows' series_points).
  std::optional<Series> series;
};

/// A cuarena row's counters (Result::counters): every Stats::to_map() key (PyTorch's
/// memory_stats() names, `allocated_bytes.all.peak`, `num_device_alloc`, ..., and cuarena's
/// `cuarena.map_calls`, ...), and each `cuarena.X` also as `X`, the name the replayer used
/// before (`map_calls`, `granules_stolen`, ...).
std::map<std::string, std::int64_t> stats_counters(const Stats& stats);

/// Events of one device, in trace order.
std::vector<Event> device_events(const std::vector<Event>& all, int device);
/// Devices that have events, ascending.
std::vector<int> devices_in(const std::vector<Event>& all);
/// Every device's events in one pass (device_events() for each device costs a pass each):
/// (device, its events in trace order), devices ascending.
std::vector<std::pair<int, std::vector<Event>>> split_by_device(std::vector<Event> all);

/// The largest sum of live requested bytes (alloc adds, free_completed of a seen alloc removes).
std::uint64_t peak_requested(const std::vector<Event>& events);

/// The q-quantile (0..1, nearest rank) of `v`, reordering it (std::nth_element); 0 when empty.
/// For Result::Latency and the benchmarks' per-call latencies.
double percentile(std::vector<double>& v, double q);

/// The recording allocator's reserved bytes rebuilt from segment_* events; with `series`, also
/// Result::series.
Result replay_recorded(const std::vector<Event>& events, bool series = false);

struct SimOptions {
  Config config;
  SimConfig device{};        ///< the simulator's keys (sim_event_latency, ...)
  std::size_t capacity = 0;  ///< bytes; 0: device.capacity or the recorded H200's
  std::string torch_conf{};  ///< PYTORCH_CUDA_ALLOC_CONF-style settings of the torch-*-sim rows
  bool series = false;       ///< fill Result::series (the row's replay; capacity probes never)
  /// Called after each allocation of the row's replay (not its re-run to the peak, nor capacity
  /// probes) with the event's index and cuarena's pointer (nullptr when it failed): lets tests
  /// see which memory each allocation got.
  std::function<void(std::size_t event, const void* ptr)> on_allocate{};
  /// Called once as the row's replay starts (not its re-run to the peak, nor capacity probes)
  /// with its allocator, the simulated capacity in bytes and the trace's device: what it
  /// returns is held until that replay ends, before the allocator goes (--publish).
  std::function<std::shared_ptr<void>(const Allocator&, std::uint64_t capacity, int device)>
      on_replay_start{};
  /// Host microseconds to sleep before each event of the row's replay (--pace): a replay slow
  /// enough to watch.
  std::uint64_t pace_us = 0;
};

/// --publish: a monitor page (PageKind::kReplayer) for `allocator` while the replay runs, its
/// device total the simulated capacity (rows/publish.cpp). Says on stderr, once, when no page
/// can be made; the replay goes on.
std::shared_ptr<void> publish_replay(const Allocator& allocator, std::uint64_t capacity,
                                     int device);

/// Parses a config string of the core's keys and the simulator's (`sim_*`) into `options`
/// (config and device), from their defaults. Throws ConfigError as parse_config() and
/// SimConfig::check() do.
void parse_replay_config(std::string_view text, SimOptions& options);

/// The Markdown table of every key --config takes (the core's, then the simulator's), with
/// defaults: README.md's Configuration table is this text (a test holds them equal).
std::string config_markdown_table();

/// The SimBackend that `options` describe (capacity as sim_capacity_bytes(), sim_granularity,
/// sim_event_latency; a segment upstream for upstream:async and upstream:malloc).
SimBackend::Options sim_backend_options(const SimOptions& options);

/// The simulated device's bytes under `options` (--capacity, else sim_capacity, else the
/// recorded H200's 143771 MiB).
std::uint64_t sim_capacity_bytes(const SimOptions& options);

/// The most granules a simulated device may have: 16 TiB of 2 MiB granules. Both the simulator
/// and the core keep a few words per granule, so finer granules mean a smaller device.
inline constexpr std::uint64_t kMaxSimGranules = std::uint64_t{1} << 23;

/// The largest capacity the simulator replays under with granules of `granularity` bytes:
/// kMaxDeviceBytes, and at most kMaxSimGranules granules. The capacity searches stop there.
std::uint64_t max_sim_capacity(std::uint64_t granularity);

/// Throws TraceError (without the file's name) when a device's live requested bytes (by the
/// replay loop's rules) or its recorded segments ever add up to more than kMaxDeviceBytes: no
/// device holds that, and every replay's sums then stay far from 64-bit overflow.
void check_device_totals(const std::vector<Event>& events, int device);

/// Replays through cuarena on the SimBackend.
Result replay_cuarena(const std::vector<Event>& events, const SimOptions& options);

/// The smallest multiple of `step` bytes for which `fits` holds, by binary search between
/// `floor` (nothing below it can fit: the peak requested bytes) and `known_good` (the row's own
/// peak reserved). If `known_good` does not fit, it is doubled up to `ceiling` first;
/// std::nullopt when even `ceiling` does not fit. Assumes `fits` is monotone. Used by the
/// simulator's and the GPU's --min-capacity.
std::optional<std::uint64_t> search_min_capacity(std::uint64_t step, std::uint64_t floor,
                                                 std::uint64_t known_good, std::uint64_t ceiling,
                                                 const std::function<bool(std::uint64_t)>& fits);

/// Smallest capacity (a granule multiple) under which replay_cuarena has no out-of-memory; 0
/// when nothing up to 2^50 bytes fits.
std::uint64_t min_capacity(const std::vector<Event>& events, const SimOptions& options,
                           std::uint64_t known_good);

/// The capacities that check a search's answer: +2 MiB steps up to +16 MiB, +1% and +5%,
/// each a multiple of `step` above `answer` (ascending, no repeats).
std::vector<std::uint64_t> probe_capacities(std::uint64_t answer, std::uint64_t step);

/// search_min_capacity() without trusting monotonicity, which a caching allocator need not have
/// (a larger device can change its choices and fail where a smaller one succeeded). After the
/// search, replays at probe_capacities() of its answer; the result is the smallest capacity
/// probed (or searched) above which every probe fits. A probe that fails with nothing probed
/// above it starts a new search above that probe (three rounds at most).
struct CheckedMinCapacity {
  std::optional<std::uint64_t> bytes;  ///< the answer; nullopt when nothing up to the ceiling fits
  std::optional<std::uint64_t> searched;  ///< the binary search's first answer
  std::vector<CapacityProbe> probes;      ///< every probe, in the order made
};
CheckedMinCapacity checked_min_capacity(std::uint64_t step, std::uint64_t floor,
                                        std::uint64_t known_good, std::uint64_t ceiling,
                                        const std::function<std::uint64_t(std::uint64_t)>& ooms_at);

/// checked_min_capacity() for replay_cuarena on the simulator (what min_capacity() searches).
CheckedMinCapacity min_capacity_checked(const std::vector<Event>& events, const SimOptions& options,
                                        std::uint64_t known_good);

}  // namespace cuarena::replay
