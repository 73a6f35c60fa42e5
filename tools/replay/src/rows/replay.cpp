#include "cuarena/replay/replay.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cuarena/allocator.hpp"
#include "cuarena/replay/replay_loop.hpp"
#include "cuarena/sim_backend.hpp"

namespace cuarena::replay {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A set of disjoint half-open address ranges (the recording allocator's mapped segments).
class RangeSet {
 public:
  void add(std::uint64_t lo, std::uint64_t hi) {
    remove(lo, hi);
    ranges_[lo] = hi;
  }
  void remove(std::uint64_t lo, std::uint64_t hi) {
    auto it = ranges_.lower_bound(lo);
    if (it != ranges_.begin()) --it;
    while (it != ranges_.end() && it->first < hi) {
      const std::uint64_t a = it->first, b = it->second;
      if (b <= lo) {
        ++it;
        continue;
      }
      it = ranges_.erase(it);
      if (a < lo) ranges_[a] = lo;
      if (b > hi) ranges_[hi] = b;
    }
  }
  const std::map<std::uint64_t, std::uint64_t>& ranges() const { return ranges_; }

 private:
  std::map<std::uint64_t, std::uint64_t> ranges_;
};

std::int64_t segment_delta(const Event& e) {
  switch (e.action) {
    case Action::kSegmentAlloc:
    case Action::kSegmentMap:
      return std::int64_t(e.size);
    case Action::kSegmentFree:
    case Action::kSegmentUnmap:
      return -std::int64_t(e.size);
    default:
      return 0;
  }
}

std::uint64_t pytorch_rounded(std::uint64_t size) {
  return size < 512 ? 512 : (size + 511) / 512 * 512;
}

struct FreeExtents {
  std::uint64_t total = 0, largest = 0, pieces = 0;
};

// The recording allocator's free memory after events[0..last], rebuilt from its segments and
// live blocks. Block sizes are the requests rounded as PyTorch rounds them; unsplit remainders
// count as free; each gap between blocks in a mapped range is one piece.
FreeExtents recorded_free(const std::vector<Event>& events, std::size_t last) {
  // Live blocks by the replay loop's rules (a lost free, a free never allocated).
  struct Hooks : TraceHooks<char> {
    RangeSet mapped;
    std::map<std::uint64_t, std::uint64_t> blocks;
    void on_event(std::size_t, const Event& e) {
      if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap)
        mapped.add(e.addr, e.addr + e.size);
      else if (e.action == Action::kSegmentFree || e.action == Action::kSegmentUnmap)
        mapped.remove(e.addr, e.addr + e.size);
    }
    char on_alloc(std::size_t, const Event& e) {
      blocks[e.addr] = pytorch_rounded(e.size);
      return 0;
    }
    void on_free(std::size_t, const Event& e, char&) {
      if (e.action != Action::kAlloc) blocks.erase(e.addr);  // a lost free: on_alloc replaces it
    }
  } hooks;
  run_trace<char>(events, hooks, last + 1);
  const RangeSet& mapped = hooks.mapped;
  const std::map<std::uint64_t, std::uint64_t>& blocks = hooks.blocks;
  FreeExtents f;
  auto gap = [&f](std::uint64_t bytes) {
    f.total += bytes;
    f.largest = std::max(f.largest, bytes);
    ++f.pieces;
  };
  for (const auto& [lo, hi] : mapped.ranges()) {
    std::uint64_t pos = lo;
    for (auto it = blocks.lower_bound(lo); it != blocks.end() && it->first < hi; ++it) {
      if (it->first > pos) gap(it->first - pos);
      pos = std::max(pos, std::min(hi, it->first + it->second));
    }
    if (hi > pos) gap(hi - pos);
  }
  return f;
}

}  // namespace

std::map<std::string, std::int64_t> stats_counters(const Stats& stats) {
  const std::map<std::string, std::int64_t> all = stats.to_map();
  std::map<std::string, std::int64_t> out = all;
  const std::string prefix = "cuarena.";
  for (const auto& [key, value] : all)
    if (key.rfind(prefix, 0) == 0) out.emplace(key.substr(prefix.size()), value);
  return out;
}

std::vector<Event> device_events(const std::vector<Event>& all, int device) {
  std::vector<Event> out;
  std::copy_if(all.begin(), all.end(), std::back_inserter(out),
               [device](const Event& e) { return e.device == device; });
  return out;
}

std::vector<int> devices_in(const std::vector<Event>& all) {
  std::set<int> seen;
  for (const Event& e : all) seen.insert(e.device);
  return {seen.begin(), seen.end()};
}

std::vector<std::pair<int, std::vector<Event>>> split_by_device(std::vector<Event> all) {
  if (!all.empty() && std::all_of(all.begin(), all.end(),
                                  [&](const Event& e) { return e.device == all.front().device; })) {
    const int device = all.front().device;
    std::vector<std::pair<int, std::vector<Event>>> one;
    one.emplace_back(device, std::move(all));  // the common case: no second copy of a large trace
    return one;
  }
  std::map<int, std::vector<Event>> by;
  for (const Event& e : all) by[e.device].push_back(e);
  return {std::make_move_iterator(by.begin()), std::make_move_iterator(by.end())};
}

SeriesRecorder::SeriesRecorder(std::size_t events, std::size_t max_points) {
  const std::uint64_t m = std::max<std::uint64_t>(max_points, 1);
  s_.window = std::max<std::uint64_t>(1, (std::uint64_t(events) + m - 1) / m);
  const std::size_t points = std::size_t((std::uint64_t(events) + s_.window - 1) / s_.window);
  s_.event.reserve(points);
  s_.reserved.reserve(points);
}

void SeriesRecorder::close_point() {
  s_.event.push_back(added_ - 1);
  s_.reserved.push_back(max_);
  max_ = 0;
}

void SeriesRecorder::add(std::uint64_t reserved) {
  max_ = std::max(max_, reserved);
  if (++added_ % s_.window == 0) close_point();
}

Series SeriesRecorder::finish(const std::vector<Event>& events) {
  if (added_ % s_.window != 0) close_point();
  const std::size_t n = std::min<std::size_t>(std::size_t(added_), events.size());
  // Live requested bytes after each event, by peak_requested()'s rules.
  struct Hooks : RequestedHooks {
    Series* s;
    std::size_t n;
    std::uint64_t window_max = 0;
    bool timed = false;
    bool after(std::size_t i, const Event& e) {
      timed = timed || e.time_us != 0;
      window_max = std::max(window_max, current);
      if ((i + 1) % s->window == 0 || i + 1 == n) {
        s->requested.push_back(window_max);
        window_max = 0;
      }
      return true;
    }
  } hooks;
  hooks.s = &s_;
  hooks.n = n;
  s_.requested.reserve(s_.event.size());
  run_trace<std::uint64_t>(events, hooks, n);
  const bool timed = hooks.timed;
  s_.requested.resize(s_.event.size(), 0);  // add() called past the events: nothing requested
  if (timed) {
    s_.time_us.reserve(s_.event.size());
    for (std::uint64_t i : s_.event) s_.time_us.push_back(i < n ? events[i].time_us : 0);
  }
  return std::move(s_);
}

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t k = std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

std::uint64_t peak_requested(const std::vector<Event>& events) {
  struct Hooks : RequestedHooks {
    std::uint64_t peak = 0;
    bool after(std::size_t, const Event&) {
      peak = std::max(peak, current);
      return true;
    }
  } hooks;
  run_trace<std::uint64_t>(events, hooks);
  return hooks.peak;
}

Result replay_recorded(const std::vector<Event>& events, bool series) {
  const auto start = Clock::now();
  std::optional<SeriesRecorder> rec;
  if (series) rec.emplace(events.size());
  Result r;
  r.allocator = "recorded";
  r.backend = "trace";
  // Reserved bytes from the segment events; the loop counts allocs and frees (blocks are
  // not replayed: a lost free replaces the old block and is not counted as skipped).
  struct Hooks : TraceHooks<char> {
    Result* r;
    SeriesRecorder* rec;
    std::int64_t reserved = 0, peak = 0;
    std::size_t peak_index = 0, first_oom = 0;
    void on_event(std::size_t i, const Event& e) {
      reserved += segment_delta(e);
      if (e.action == Action::kOom && r->ooms++ == 0) first_oom = i;
    }
    bool after(std::size_t i, const Event&) {
      if (reserved > peak) {
        peak = reserved;
        peak_index = i;
      }
      if (rec) rec->add(std::uint64_t(std::max<std::int64_t>(reserved, 0)));
      return true;
    }
  } hooks;
  hooks.r = &r;
  hooks.rec = rec ? &*rec : nullptr;
  const TraceCounts counts =
      run_trace<char>(events, hooks, events.size(), {.lost_free_skipped = false});
  r.allocs = counts.allocs;
  r.frees = counts.frees;
  r.skipped_events = counts.skipped;
  const std::int64_t peak = hooks.peak;
  const std::size_t peak_index = hooks.peak_index, first_oom = hooks.first_oom;
  r.peak_reserved_bytes = std::uint64_t(std::max<std::int64_t>(peak, 0));
  if (rec) r.series = rec->finish(events);

  // Fragmentation at the peak, and the free pieces at the first out-of-memory event.
  if (peak > 0) {
    const FreeExtents f = recorded_free(events, peak_index);
    r.external_fragmentation = f.total == 0 ? 0.0 : 1.0 - double(f.largest) / double(f.total);
    r.free_at_peak_bytes = f.total;
  }
  if (r.ooms > 0) {
    const FreeExtents f = recorded_free(events, first_oom);
    r.first_oom =
        Result::FirstOom{first_oom,   events[first_oom].size, f.total, f.pieces, f.largest,
                         std::nullopt};  // the device's free: not recorded
  }
  r.peak_requested_bytes = peak_requested(events);
  r.reserved_ratio =
      r.peak_requested_bytes ? double(r.peak_reserved_bytes) / double(r.peak_requested_bytes) : 0;
  r.elapsed_s = seconds_since(start);
  return r;
}

SimBackend::Options sim_backend_options(const SimOptions& o) {
  SimBackend::Options so;
  if (o.capacity)
    so.capacity = o.capacity;
  else if (o.device.capacity)
    so.capacity = o.device.capacity;
  so.granularity = o.device.granularity;
  so.event_latency = o.device.event_latency;
  so.segments = o.config.upstream != Upstream::kVmm;  // async/malloc: the segment upstream path
  return so;
}

namespace {

struct SimRun {
  std::uint64_t ooms = 0, allocs = 0, frees = 0, skipped = 0;
  std::uint64_t peak_reserved = 0;
  std::size_t peak_index = 0;
  Allocator::Fragmentation frag;
  Allocator::MemoryBreakdown breakdown;
  std::map<std::string, std::int64_t> counters;
  std::optional<Result::FirstOom> first_oom;
  std::uint64_t limit = 0;  // the allocator's memory_limit()
};

// The first failed allocation and the memory free just after it (the allocator has released
// what it could before failing): maximal runs of inactive pieces in the reserved segments,
// and what was never reserved. O(live blocks + mapped granules), once per replay.
Result::FirstOom describe_oom(const Allocator& alloc, const SimBackend& sim, std::size_t index,
                              std::uint64_t request) {
  Result::FirstOom f{index, request, 0, 0, 0, 0};
  using State = Allocator::SegmentInfo::State;
  for (const Allocator::SegmentInfo& seg : alloc.segments()) {
    std::uint64_t run = 0, run_end = 0;
    auto close = [&] {
      if (run == 0) return;
      *f.cached_free += run;
      *f.pieces += 1;
      f.largest_piece = std::max(*f.largest_piece, run);
      run = 0;
    };
    for (const auto& p : seg.blocks) {
      if (p.state != State::kInactive) {
        close();
        continue;
      }
      if (run != 0 && p.addr != run_end) close();
      run += p.size;
      run_end = p.addr + p.size;
    }
    close();
  }
  const std::uint64_t limit = alloc.memory_limit(), held = sim.physical_bytes();
  f.unreserved = limit > held ? limit - held : 0;
  return f;
}

// Replays events[0, stop) (all when stop is npos); measures fragmentation at `stop`. Feeds
// `series` (when given) the reserved bytes after each event.
//
// Frees: a deferred free (deferred_frees(): PyTorch records the free_completed of a block used on
// other streams through record_stream once their events complete) is made at free_requested,
// the block marked in use on a stream of its own (record_stream) that the SimBackend holds until
// the replay reaches the free_completed: cuarena's pending-free path decides when the memory is
// reusable. Every other block is freed at its free_completed.
SimRun run_sim(const std::vector<Event>& events, const SimOptions& options, std::size_t stop,
               SeriesRecorder* series = nullptr, bool observe = false) {
  const SimBackend::Options sim_options = sim_backend_options(options);
  SimBackend sim(sim_options);
  Allocator alloc(sim, options.config);
  std::shared_ptr<void> published;  // after alloc: goes first
  if (observe && options.on_replay_start)
    published = options.on_replay_start(alloc, sim_options.capacity,
                                        events.empty() ? 0 : int(events.front().device));
  std::unordered_set<std::uint64_t> streams;  // the trace's, which a held stream must not be
  for (const Event& e : events) streams.insert(e.stream);
  SimRun run;
  // The handle: cuarena's pointer (nullptr: the allocation failed).
  struct Hooks : TraceHooks<void*> {
    SimBackend& sim;
    Allocator& alloc;
    const SimOptions& options;
    const std::unordered_set<std::uint64_t>& streams;
    SimRun& run;
    SeriesRecorder* series;
    bool observe;
    // Blocks freed at free_requested, by trace address: the stream held until free_completed
    // (0: the allocation had failed, nothing to release).
    std::unordered_map<std::uint64_t, StreamId> held{};
    std::uint64_t next_held = ~std::uint64_t{0};  // synthetic streams, downwards

    void on_event(std::size_t, const Event& e) {
      if (observe && options.pace_us)
        std::this_thread::sleep_for(std::chrono::microseconds(options.pace_us));
      sim.advance(1);
      sim.queue_work(e.stream);
    }
    void* on_alloc(std::size_t i, const Event& e) {
      void* p = nullptr;
      try {
        p = alloc.allocate(e.size, e.stream);
      } catch (const OutOfMemoryError&) {
        if (run.ooms++ == 0) run.first_oom = describe_oom(alloc, sim, i, e.size);
      }
      if (observe && options.on_allocate) options.on_allocate(i, p);
      return p;  // nullptr: failed; its free is then a no-op
    }
    void on_free(std::size_t, const Event&, void*& p) {
      if (p) alloc.deallocate(p);
    }
    void on_deferred_free(std::size_t, const Event& e, void*& p) {
      StreamId s = 0;
      if (p) {
        do s = next_held--;
        while (streams.count(s));
        sim.hold_stream(s);
        alloc.record_stream(p, s);
        alloc.deallocate(p);
      }
      held[e.addr] = s;
    }
    void on_deferred_free_completed(std::size_t, const Event& e) {
      if (auto h = held.find(e.addr); h != held.end()) {
        if (h->second) sim.release_stream(h->second);
        held.erase(h);
      }
    }
    bool after(std::size_t i, const Event&) {
      if (sim.physical_bytes() > run.peak_reserved) {
        run.peak_reserved = sim.physical_bytes();
        run.peak_index = i;
      }
      if (series) series->add(sim.physical_bytes());
      return true;
    }
  } hooks{{}, sim, alloc, options, streams, run, series, observe};
  const std::size_t end =
      stop == std::string::npos ? events.size() : std::min(stop + 1, events.size());
  const TraceCounts counts = run_trace<void*>(events, hooks, end, {.deferred_at_request = true});
  run.allocs = counts.allocs;
  run.frees = counts.frees;
  run.skipped = counts.skipped;
  if (stop != std::string::npos) {
    run.frag = alloc.fragmentation();
    run.breakdown = alloc.memory_breakdown();
  }
  run.counters = stats_counters(alloc.stats());
  run.limit = alloc.memory_limit();
  return run;
}

}  // namespace

void parse_replay_config(std::string_view text, SimOptions& options) {
  options.config = Config{};
  options.device = SimConfig{};
  parse_config(text, {ConfigTarget(Config::table(), options.config),
                      ConfigTarget(SimConfig::table(), options.device)});
  options.device.check();
}

std::string config_markdown_table() {
  return config_markdown(Config::table(), true) + config_markdown(SimConfig::table(), false);
}

std::uint64_t sim_capacity_bytes(const SimOptions& options) {
  return sim_backend_options(options).capacity;
}

std::uint64_t max_sim_capacity(std::uint64_t granularity) {
  return std::min<std::uint64_t>(kMaxDeviceBytes, kMaxSimGranules * granularity);
}

void check_device_totals(const std::vector<Event>& events, int device) {
  // Each event's size is at most kMaxDeviceBytes (the reader's rule), so the sums below cannot
  // wrap before they are caught: one step adds at most 2^44 to a value of at most 2^44.
  struct Hooks : RequestedHooks {
    std::int64_t segments = 0;
    std::size_t bad = std::string::npos;
    const char* what = nullptr;
    void on_event(std::size_t, const Event& e) { segments += segment_delta(e); }
    bool after(std::size_t i, const Event&) {
      if (current > kMaxDeviceBytes)
        what = "the live allocations add up to";
      else if (segments > std::int64_t(kMaxDeviceBytes) ||
               segments < -std::int64_t(kMaxDeviceBytes))
        what = "the recorded segments add up to";
      if (what) bad = i;
      return !what;
    }
  } hooks;
  run_trace<std::uint64_t>(events, hooks);
  if (hooks.what) {
    throw TraceError("device " + std::to_string(device) + ", event " + std::to_string(hooks.bad) +
                     ": " + hooks.what + " more than any device holds (16 TiB)");
  }
}

Result replay_cuarena(const std::vector<Event>& events, const SimOptions& options) {
  const auto start = Clock::now();
  std::optional<SeriesRecorder> rec;
  if (options.series) rec.emplace(events.size());
  SimRun run = run_sim(events, options, std::string::npos, rec ? &*rec : nullptr, true);
  Result r;
  if (rec) r.series = rec->finish(events);
  r.allocator = "cuarena";
  r.backend = "sim";
  r.ooms = run.ooms;
  r.allocs = run.allocs;
  r.frees = run.frees;
  r.skipped_events = run.skipped;
  r.peak_reserved_bytes = run.peak_reserved;
  r.counters = run.counters;
  r.first_oom = run.first_oom;
  r.capacity_bytes = run.limit;
  r.elapsed_s = seconds_since(start);
  // Fragmentation at the peak: the replay is deterministic, so run again up to that event.
  if (run.peak_reserved > 0) {
    const SimRun at_peak = run_sim(events, options, run.peak_index);
    r.external_fragmentation = at_peak.frag.external();
    r.free_at_peak_bytes = at_peak.frag.free_bytes;
    r.rounding_waste_bytes = at_peak.frag.rounding_waste;
    const Allocator::MemoryBreakdown& b = at_peak.breakdown;
    r.counters["peak.in_use_bytes"] = std::int64_t(b.in_use);
    r.counters["peak.slab_free_bytes"] = std::int64_t(b.slab_free);
    r.counters["peak.owned_cached_bytes"] = std::int64_t(b.owned_cached);
    r.counters["peak.shared_cached_bytes"] = std::int64_t(b.shared_cached);
    r.counters["peak.retired_bytes"] = std::int64_t(b.retired);
    r.counters["peak.idle_bytes"] = std::int64_t(b.idle);
  }
  r.peak_requested_bytes = peak_requested(events);
  r.reserved_ratio =
      r.peak_requested_bytes ? double(r.peak_reserved_bytes) / double(r.peak_requested_bytes) : 0;
  return r;
}

std::optional<std::uint64_t> search_min_capacity(std::uint64_t step, std::uint64_t floor,
                                                 std::uint64_t known_good, std::uint64_t ceiling,
                                                 const std::function<bool(std::uint64_t)>& fits) {
  const std::uint64_t g = step;
  const std::uint64_t top = std::max<std::uint64_t>(1, ceiling / g);  // in steps
  std::uint64_t hi = std::clamp<std::uint64_t>((known_good + g - 1) / g, 1, top);
  while (!fits(hi * g)) {
    if (hi == top) return std::nullopt;
    hi = std::min(hi * 2, top);
  }
  std::uint64_t lo = std::min(floor / g, hi);  // below this nothing can fit
  if (lo > 0) --lo;
  while (hi - lo > 1) {  // invariant: hi fits, lo does not (or is the floor)
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (fits(mid * g))
      hi = mid;
    else
      lo = mid;
  }
  return hi * g;
}

std::uint64_t min_capacity(const std::vector<Event>& events, const SimOptions& options,
                           std::uint64_t known_good) {
  auto fits = [&](std::uint64_t capacity) {
    SimOptions o = options;
    o.capacity = capacity;
    return run_sim(events, o, std::string::npos).ooms == 0;
  };
  return search_min_capacity(options.device.granularity, peak_requested(events), known_good,
                             max_sim_capacity(options.device.granularity), fits)
      .value_or(0);
}

std::vector<std::uint64_t> probe_capacities(std::uint64_t answer, std::uint64_t step) {
  auto up = [step](std::uint64_t bytes) {
    return std::max(step, (bytes + step - 1) / step * step);
  };
  const std::uint64_t near = up(std::uint64_t{2} << 20);  // 2 MiB, or one step if larger
  std::set<std::uint64_t> out;
  for (std::uint64_t d = near; d <= (std::uint64_t{16} << 20) || d == near; d += near)
    out.insert(answer + d);
  out.insert(answer + up(answer / 100));
  out.insert(answer + up(answer / 20));
  return {out.begin(), out.end()};
}

CheckedMinCapacity checked_min_capacity(
    std::uint64_t step, std::uint64_t floor, std::uint64_t known_good, std::uint64_t ceiling,
    const std::function<std::uint64_t(std::uint64_t)>& ooms_at) {
  auto fits = [&](std::uint64_t capacity) { return ooms_at(capacity) == 0; };
  CheckedMinCapacity out;
  out.searched = search_min_capacity(step, floor, known_good, ceiling, fits);
  if (!out.searched) return out;
  std::uint64_t answer = *out.searched;
  std::map<std::uint64_t, std::uint64_t> seen;  // probed capacity -> out-of-memory failures
  for (int round = 0; round < 3; ++round) {
    for (std::uint64_t c : probe_capacities(answer, step)) {
      if (c > ceiling || seen.count(c)) continue;
      const std::uint64_t ooms = ooms_at(c);
      seen.emplace(c, ooms);
      out.probes.push_back({c, ooms});
    }
    std::optional<std::uint64_t> worst;  // the largest probe above the answer that fails
    for (const auto& [c, ooms] : seen)
      if (c > answer && ooms > 0) worst = c;
    if (!worst) break;
    const auto above = seen.upper_bound(*worst);  // every probe from here up fits
    if (above != seen.end()) {
      answer = above->first;
      break;
    }
    const auto again = search_min_capacity(step, *worst + step, std::max(known_good, *worst + step),
                                           ceiling, fits);
    if (!again) return out;  // nothing up to the ceiling fits above the failing probe
    answer = *again;
  }
  out.bytes = answer;
  return out;
}

CheckedMinCapacity min_capacity_checked(const std::vector<Event>& events, const SimOptions& options,
                                        std::uint64_t known_good) {
  auto ooms_at = [&](std::uint64_t capacity) {
    SimOptions o = options;
    o.capacity = capacity;
    return run_sim(events, o, std::string::npos).ooms;
  };
  return checked_min_capacity(options.device.granularity, peak_requested(events), known_good,
                              max_sim_capacity(options.device.granularity), ooms_at);
}

}  // namespace cuarena::replay
