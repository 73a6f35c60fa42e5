// The replayer's one trace loop: the address bookkeeping every row shares (which trace addresses
// are live, a lost free, a free of an address never seen, which frees are deferred), with the
// row's own work in hooks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cuarena/replay/trace.hpp"

namespace cuarena::replay {

/// What the loop counted (Result::allocs, frees, skipped_events).
struct TraceCounts {
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t skipped = 0;  ///< frees of never-seen addresses, unknown actions, lost frees
};

/// The loop's rules where rows differ.
struct TraceRules {
  /// A lost free (an alloc at an address still live: the trace lost its free; the old block is
  /// freed first) counts as a skipped event. The recorded row does not count it.
  bool lost_free_skipped = true;
  /// A deferred free (deferred_frees()) is made at its free_requested, through on_deferred_free,
  /// instead of at its free_completed.
  bool deferred_at_request = false;
};

/// The trace's frees, classified once: deferred[i] is true when events[i] is a free_requested
/// whose block is freed later than the event after it, i.e. the next alloc, free_requested or
/// free_completed of its address is a free_completed further on. PyTorch records both events
/// at once for an ordinary free, and the free_completed late for a block with record_stream
/// uses on other streams (once their events complete). Anything else (an alloc or a new
/// free_requested of the address first; no free_completed: the snapshot came first) is not a
/// deferred free. O(events).
std::vector<bool> deferred_frees(const std::vector<Event>& events);

/// Hooks with nothing to do; a row's hooks derive from it and hide what they need.
/// Handle: what the row keeps per live trace address.
template <class Handle>
struct TraceHooks {
  /// Every event, first, before the loop's own handling (a clock tick, segment and oom events).
  void on_event(std::size_t /*i*/, const Event& /*e*/) {}
  /// An allocation (after the lost free of its address, if any, went to on_free).
  Handle on_alloc(std::size_t /*i*/, const Event& /*e*/) { return Handle{}; }
  /// A live block freed: at its free_completed, or at a later alloc of its address (a lost
  /// free; `e` is then that alloc).
  void on_free(std::size_t /*i*/, const Event& /*e*/, Handle& /*h*/) {}
  /// The free_requested of a live block that stays live until its free_completed.
  void on_free_requested(std::size_t /*i*/, const Event& /*e*/, Handle& /*h*/) {}
  /// With TraceRules::deferred_at_request, the free_requested of a live block whose free is
  /// deferred: freed now (counted as its free).
  void on_deferred_free(std::size_t /*i*/, const Event& /*e*/, Handle& /*h*/) {}
  /// The free_completed of a block on_deferred_free freed.
  void on_deferred_free_completed(std::size_t /*i*/, const Event& /*e*/) {}
  /// After every event (the peak hook: peaks, series); false stops the replay there.
  bool after(std::size_t /*i*/, const Event& /*e*/) { return true; }
  /// The blocks still live when the replay ends (trace address -> Handle), once.
  template <class Live>
  void on_end(Live& /*live*/) {}
};

/// Replays events[0, end) through `hooks` (Handle as in TraceHooks).
template <class Handle, class Hooks>
TraceCounts run_trace(const std::vector<Event>& events, Hooks& hooks,
                      std::size_t end = std::numeric_limits<std::size_t>::max(),
                      TraceRules rules = {}) {
  std::unordered_map<std::uint64_t, Handle> live;  // trace address -> the row's block
  std::unordered_set<std::uint64_t> early;         // freed at free_requested, not yet completed
  std::vector<bool> deferred;  // deferred_frees(events), computed at the first free_requested
  bool classified = false;
  TraceCounts c;
  end = std::min(end, events.size());
  for (std::size_t i = 0; i < end; ++i) {
    const Event& e = events[i];
    hooks.on_event(i, e);
    switch (e.action) {
      case Action::kAlloc: {
        ++c.allocs;
        if (auto old = live.find(e.addr); old != live.end()) {  // the trace lost its free
          hooks.on_free(i, e, old->second);
          live.erase(old);
          if (rules.lost_free_skipped) ++c.skipped;
        }
        // Live even when the row's allocation failed (an empty handle its on_free ignores):
        // the job had the block, so its free is a free and a later alloc there a lost free.
        live.emplace(e.addr, hooks.on_alloc(i, e));
        break;
      }
      case Action::kFreeRequested: {
        auto it = live.find(e.addr);
        if (it == live.end()) break;
        if (rules.deferred_at_request && !classified) {
          deferred = deferred_frees(events);  // the whole trace: a free may complete past `end`
          classified = true;
        }
        if (!rules.deferred_at_request || !deferred[i]) {
          hooks.on_free_requested(i, e, it->second);
          break;
        }
        hooks.on_deferred_free(i, e, it->second);
        ++c.frees;
        early.insert(e.addr);
        live.erase(it);
        break;
      }
      case Action::kFreeCompleted: {
        if (early.erase(e.addr)) {
          hooks.on_deferred_free_completed(i, e);
          break;
        }
        auto it = live.find(e.addr);
        if (it == live.end()) {
          ++c.skipped;
          break;
        }
        ++c.frees;
        hooks.on_free(i, e, it->second);
        live.erase(it);
        break;
      }
      case Action::kOther:
        ++c.skipped;
        break;
      default:
        break;
    }
    if (!hooks.after(i, e)) break;
  }
  hooks.on_end(live);
  return c;
}

/// Live requested bytes by the loop's rules (an alloc adds its size, the free of a live block
/// removes it), for peak_requested() and a series' requested bytes.
struct RequestedHooks : TraceHooks<std::uint64_t> {
  std::uint64_t current = 0;
  std::uint64_t on_alloc(std::size_t, const Event& e) {
    current += e.size;
    return e.size;
  }
  void on_free(std::size_t, const Event&, std::uint64_t& size) { current -= size; }
};

}  // namespace cuarena::replay
