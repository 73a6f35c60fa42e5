// Allocator configuration: the core's keys of a config string (syntax: config_table.hpp).
// Config::table() is the one list of them; the simulator's keys are SimConfig's
// (sim_backend.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuarena/config_table.hpp"

namespace cuarena {

enum class Upstream { kVmm, kAsync, kMalloc };

/// The config value naming `u`: "vmm", "async" or "malloc".
constexpr const char* to_string(Upstream u) {
  return u == Upstream::kVmm ? "vmm" : u == Upstream::kAsync ? "async" : "malloc";
}

/// Where a large request is placed among the free blocks a stream may use.
enum class Placement {
  kUnified,  ///< one best fit over the stream's own and the shared blocks (default)
  kOwnFirst  ///< the stream's own blocks first, the shared ones after a miss
};

struct Config {
  /// Requests of at most this many bytes are served from size-class slabs.
  std::size_t small_limit = std::size_t{1} << 20;
  /// Size classes per power of two (>= 1; the default 4 bounds rounding waste to 1/8).
  unsigned size_classes_per_doubling = 4;
  /// Target slab span in bytes; a slab holds max(1, slab_size / class_size) blocks.
  std::size_t slab_size = std::size_t{1} << 20;
  /// Fraction of the memory limit below which a miss maps fresh granules; at or above it, a miss
  /// first steals cached free granules (defragmentation). 0 (default): always reuse first.
  double defrag_threshold = 0.0;
  /// Cached memory allowed on top of the peak of allocated bytes before a miss reuses cached
  /// granules instead of growing (0.05: up to 5% more memory, far fewer granule moves, each a
  /// driver call; costs in docs/results.md). 0 (default): reuse first, always, when memory-first;
  /// placing whole chunks (whole_chunk_min > 0, until the pool turns memory-first), the slack is at
  /// least 2% (tuning::kWholeChunkCacheSlack).
  double cache_slack = 0.0;
  /// 0 (default, memory first): every 2 MiB granule is its own cuMemCreate handle and moves
  /// singly to wherever it is needed, at one driver call each; with loop_plan (also default) a
  /// repeating loop stops calling the driver once planned. Otherwise fresh physical memory for a
  /// run of at least this many bytes of one request is created as whole chunks: one handle each,
  /// so one create/map/set-access call instead of one per granule. A whole chunk moves only as
  /// one piece, so it strands memory where a live block covers part of it (see whole_chunk_max).
  std::size_t whole_chunk_min = 0;
  /// Largest whole chunk, in bytes (also at most 1/16 of the memory already reserved, when that
  /// is over 32 MiB): a longer
  /// run is cut into equal chunks no larger. A whole chunk partly under a live block cannot
  /// move, so smaller chunks strand less memory; each costs one more create/map/set-access call.
  /// 0: only the 1/16 rule.
  std::size_t whole_chunk_max = std::size_t{128} << 20;
  /// With whole chunks (whole_chunk_min > 0): when reserved memory is to pass this fraction of
  /// the limit (memory is short), the large pool turns memory-first, as whole_chunk_min:0 places
  /// from the start: fresh memory comes as single granules, which can move wherever they are
  /// needed, placed by one best fit over the stream's own and the shared blocks. Fewer bytes for
  /// more driver calls, so a job near its limit fits where whole chunks would strand memory. It
  /// turns back when an empty_cache() (release_cached) leaves reserved memory below half this
  /// fraction. 1: never.
  double whole_chunk_fraction = 0.75;
  /// Dormant mappings each physical granule may keep. When a cached granule moves to back
  /// another address, its old mapping stays (dormant) instead of being unmapped, so a later
  /// request there takes it back with no driver call once it is idle again; a training loop
  /// then reaches a steady state with no map calls, as GMLake's cached stitched blocks do (Guo
  /// et al., ASPLOS 2024). Past this many, the oldest is unmapped. 0: unmap at once.
  unsigned dormant_maps = 4;
  /// Learn a loop that repeats exactly (its requests' sizes and streams, in order) and serve
  /// each request at an offset planned for the whole iteration inside one range that stays
  /// mapped (LoopPlanner, PlannedRange): from about the sixth iteration no driver calls, and
  /// the range is close to the loop's peak of live bytes. The range is backed part by part as
  /// the loop first uses it, with the memory its older blocks free, so putting a plan in use
  /// costs no peak. Requests the plan does not foresee are served as usual. Default on.
  bool loop_plan = true;
  /// Under loop_plan, let a planned block reuse bytes another stream freed moments before by
  /// making the new block's stream wait on the device for that free (an event recorded there,
  /// cuStreamWaitEvent; the host never blocks), as cudaMallocAsync's internal dependencies do.
  /// Plans then pack blocks of different streams as tightly as one stream's. False: such blocks
  /// are planned a margin (256 requests and frees) apart, and one whose free the device has not
  /// reached yet is served by the pool instead. A backend that cannot order streams behaves as
  /// false.
  bool plan_stream_waits = true;
  /// Fraction of the device capacity cuarena may hold (PyTorch's per_process_memory_fraction).
  double per_process_memory_fraction = 1.0;
  /// Reuse a stream's own freed granules for its next request at once, by mapping them at the
  /// new address too (no wait for the device). False: only granules whose events completed.
  bool stream_alias = true;
  /// Before creating physical memory for a request while other streams hold freed blocks the
  /// device has not reached yet (so they cannot be reused), wait on the host for those frees
  /// and try again first. Keeps a program whose streams free far ahead of the device from
  /// growing by what is about to be free, at a host wait each time; a single-stream job never
  /// waits. Off by default (PyTorch's allocator never waits); the LD_PRELOAD shim turns it on.
  bool wait_before_grow = false;
  /// Before creating memory while other streams hold freed blocks the device has not reached
  /// yet, take the smallest such block that holds the request, making the requesting stream
  /// wait on the device for its owner's work so far (an event there, cuStreamWaitEvent): no
  /// host wait, as cudaMallocAsync's cudaMemPoolReuseAllowInternalDependencies (on by default
  /// there too). The two streams are then ordered where they were not; only where the request
  /// would otherwise have grown the device's memory. Needs a backend that orders streams (the
  /// CUDA and simulator ones); else no effect. A stream under graph capture is never made to
  /// wait nor has an event recorded on it: its requests, and others' for its frees, grow instead.
  bool internal_dependencies = true;
  /// Most bytes of freed blocks each stream's cache may hold (a block is parked there only when
  /// its free finds the device lock held by another thread; see allocator.hpp). Bounds the extra
  /// memory threads contending can hold, and how far a peak statistic may under-read. 0: no
  /// stream caches (every free waits for the lock). None under loop_plan either: its planner
  /// must see every free and every allocation, in order.
  std::size_t stream_cache_bytes = std::size_t{32} << 20;
  /// Frees on a stream between checks of its sweep event (which lets blocks freed there become
  /// reusable by other streams and stealable). Lower: less memory, more event calls.
  std::uint32_t sweep_interval = 16;
  /// Virtual address space reserved per arena, in bytes; 0 picks 4x the device capacity.
  std::size_t va_reserve = 0;
  /// Where a large request goes (mapping upstream only). kUnified: among the few smallest free
  /// blocks that fit, over the stream's own and the shared ones in one size order, the first
  /// that needs no driver call, else the one missing the fewest granules; a freed block absorbs
  /// the shared free neighbours its stream used last, and granules whose frees completed may
  /// move out of owned blocks too. So whether a free has been seen to complete yet (the device's
  /// lag) barely moves the layout: less memory, steadier across lags. kOwnFirst: the stream's
  /// own blocks (kept fully mapped) first, shared ones after a miss, and the sharing of
  /// completed frees left to the next request: fewer instructions per call (docs/results.md),
  /// more memory and a layout that moves with the lag. Memory
  /// first (whole_chunk_min:0) always places unified.
  Placement placement = Placement::kUnified;
  /// Which device upstream serves physical memory: vmm (mapping), async (cudaMallocAsync
  /// segments), malloc (cudaMalloc segments). The simulator models async and malloc alike, as a
  /// segment upstream. The policy never reads it (it asks the backend); it is here because every
  /// front end (CudaAllocators, the PyTorch drop-in, the shim) picks its backend from this string.
  Upstream upstream = Upstream::kVmm;

  /// Every key: its name, values, default, meaning, and how it is read and written.
  static const ConfigTable<Config>& table();

  /// Parses `text` into a Config starting from the defaults. Throws ConfigError naming the key,
  /// the character position and the valid keys (unknown key) or the expected form (bad value).
  static Config parse(std::string_view text);

  /// Parses the environment variable `CUARENA_CONF` (defaults when unset or empty).
  static Config from_env();

  /// The keys parse() accepts.
  static const std::vector<std::string>& keys();

  /// The configuration in parse() syntax; parse(to_string()) == *this.
  std::string to_string() const;

  bool operator==(const Config&) const = default;
};

/// Parses a size such as `512`, `64KiB`, `2MiB`, `80GiB` (powers of 1024) or `80GB` (powers of
/// 1000: 80e9 bytes). Units are case-sensitive; `80G` or `80gb` is refused. Throws ConfigError on
/// bad input (negative, empty, unknown unit, overflow); `what` names the value in the message.
std::size_t parse_size(std::string_view text, std::string_view what);

/// The largest device capacity cuarena accepts, in bytes (16 TiB: far above any GPU's, and
/// small enough that 4x of it in virtual address space always fits a 47-bit range).
inline constexpr std::size_t kMaxDeviceBytes = std::size_t{16} << 40;

/// Formats bytes for people: `1.50 GiB`, `512 B`.
std::string format_bytes(std::size_t bytes);

/// `text` as an error message quotes it (a config value, a file name, another program's output):
/// control characters escaped (`\n`, `\t`, `\x1b`), so the message stays one line, and cut
/// after about `max` bytes, "…" and the full length following, so it stays short.
std::string clip(std::string_view text, std::size_t max = 200);

}  // namespace cuarena
