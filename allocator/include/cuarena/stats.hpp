// Allocator statistics under PyTorch's names (torch.cuda.memory_stats()) plus cuarena's own.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace cuarena {

/// One counter as PyTorch keeps it: current value, its peak, and the running totals of increases
/// (`allocated`) and decreases (`freed`).
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
};

/// PyTorch's pool split: `all`, `small_pool` (requests served from slabs), `large_pool`.
enum class Pool : int { kAll = 0, kSmall = 1, kLarge = 2 };
using StatArray = std::array<Stat, 3>;

struct Stats {
  // PyTorch's memory_stats() families. Units: bytes for *_bytes, counts otherwise.
  StatArray allocation;                ///< live allocations
  StatArray segment;                   ///< small: live slabs; large: reserved virtual arenas
  StatArray active;                    ///< allocations plus frees waiting on other streams' events
  StatArray inactive_split;            ///< free blocks held inside reserved memory
  StatArray allocated_bytes;           ///< sum of rounded sizes of live allocations
  StatArray reserved_bytes;            ///< physical memory held (mapped granules)
  StatArray active_bytes;              ///< allocated_bytes plus pending-free bytes
  StatArray inactive_split_bytes;      ///< reserved_bytes - active_bytes
  StatArray requested_bytes;           ///< sum of requested sizes of live allocations
  Stat oversize_allocations;           ///< always 0: cuarena has no max_split_size pool
  Stat oversize_segments;              ///< always 0
  std::int64_t num_alloc_retries = 0;  ///< allocations that needed the slow (defrag) path
  std::int64_t num_ooms = 0;           ///< OutOfMemoryError thrown
  std::int64_t num_sync_all_streams = 0;  ///< host waits on events (out-of-memory path only)
  std::int64_t num_device_alloc = 0;      ///< physical chunks created
  std::int64_t num_device_free = 0;       ///< physical chunks released
  std::int64_t max_split_size = -1;

  // cuarena's own counters (cumulative unless noted).
  std::int64_t map_calls = 0;             ///< backend map() calls (each maps a run of granules)
  std::int64_t unmap_calls = 0;           ///< backend unmap() calls
  std::int64_t access_calls = 0;          ///< backend set_access() calls (one may cover many maps)
  std::int64_t granules_mapped = 0;       ///< virtual granules mapped
  std::int64_t granules_unmapped = 0;     ///< virtual granules unmapped
  std::int64_t granules_stolen = 0;       ///< cached granules of shared blocks unmapped for reuse
  std::int64_t granules_aliased = 0;      ///< granules of a stream's free blocks re-mapped for it
  std::int64_t granules_reactivated = 0;  ///< dormant mappings taken back with no driver call
  std::int64_t defrag_passes = 0;         ///< defragmentation passes run
  std::int64_t stitched_ranges = 0;       ///< requests backed by granules reclaimed elsewhere
  std::int64_t slabs_created = 0;
  std::int64_t slabs_released = 0;
  std::int64_t events_recorded = 0;  ///< backend events recorded
  /// Polls of a stream's sweeps (its oldest sweep event queried), and those that found it still
  /// running: the share pending says how far the device runs behind the host (0 when every free
  /// is done by the next poll, as in a replay without kernels; docs/results.md).
  std::int64_t sweep_polls = 0;
  std::int64_t sweep_polls_pending = 0;
  std::int64_t cross_stream_reuses = 0;  ///< blocks reused by a stream other than the freeing one
  std::int64_t grow_waits = 0;           ///< host waits for other streams' frees instead of growing
  /// Device waits instead of growing (config internal_dependencies): a stream made to wait
  /// for another's work so far, whose freed block it took.
  std::int64_t grow_stream_waits = 0;
  std::int64_t pending_frees = 0;        ///< current: frees waiting on events (record_stream)
  std::int64_t stream_cache_hits = 0;    ///< allocations served from a stream cache (no lock)
  std::int64_t stream_cached_bytes = 0;  ///< current: bytes of freed blocks parked in them
  std::int64_t loop_plans = 0;           ///< loop plans put in use (config loop_plan)
  /// 1 while the large pool places memory-first: whole_chunk_min:0, or turned so when reserved
  /// memory was to pass whole_chunk_fraction of the limit (until an empty_cache() leaves it
  /// below half of that).
  std::int64_t memory_first = 0;
  std::int64_t planned_allocations = 0;  ///< allocations served at their planned offset
  /// planned allocations' streams made to wait on the device for another stream's free
  /// (config plan_stream_waits), one per free waited for
  std::int64_t stream_waits = 0;
  /// loop plans not put in use because their packing was far over their live peak
  std::int64_t plans_refused = 0;

  /// Flattened under PyTorch's key names (`allocated_bytes.all.current`, `num_ooms`, ...) and
  /// cuarena's (`cuarena.granules_mapped`, ...).
  std::map<std::string, std::int64_t> to_map() const;
};

}  // namespace cuarena
