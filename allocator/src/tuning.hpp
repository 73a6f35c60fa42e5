// The policy's fixed numbers, each with why it has that value. What users may change is in
// Config (cuarena/config.hpp); these are the numbers no user has needed to change.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuarena/segment_size.hpp"
#include "cuarena/types.hpp"

namespace cuarena::detail::tuning {

// --- Virtual address space ------------------------------------------------------------------

/// An arena reserves this many times the device's capacity (va_reserve:0): room to place every
/// request at a fresh address many times over before a second arena is needed; address space
/// costs nothing physical.
inline constexpr std::size_t kVaReserveFactor = 4;

// --- Segment upstreams (cudaMalloc, cudaMallocAsync) -------------------------------------------

/// PyTorch's segment sizes (cuarena/segment_size.hpp) in the backend's granules `g`: one granule
/// for requests up to 1 MiB (slabs), ten (PyTorch's kLargeBuffer, 20 MiB at 2 MiB granules) for
/// requests under 10 MiB, so mid-size requests share segments; larger ones their own size.
constexpr SegmentSizeRule segment_rule(std::size_t g) { return {1 * MiB, g, 10 * MiB, 10 * g, g}; }

// --- Block placement ---------------------------------------------------------------------------

/// Free blocks best_fit() weighs (the smallest that fit, the stream's own and the shared ones in
/// one order): picking the first that needs no driver call, else the one missing the fewest
/// granules, stops a training loop from moving memory every iteration, and bounding the count
/// keeps the search O(log n).
inline constexpr int kBackedFitCandidates = 8;
/// Placing whole chunks (the default until it turns memory-first), cached memory allowed on top
/// of the peak of allocated bytes before a miss steals cached granules instead of growing
/// (Config::cache_slack, when larger, wins). Stealing moves memory a granule at a time, a map
/// call each, and stitching a request from stolen granules left holes that later grew: a small
/// slack held less memory on most bundled traces, and made fewer driver calls
/// (docs/results.md).
inline constexpr double kWholeChunkCacheSlack = 0.02;

// --- Loop plans (config loop_plan) -------------------------------------------------------------

/// Longest loop, in requests, the planner learns: its history holds twice this many
/// (~40 B each). A pass of a bundled training or inference trace is far shorter; LLM generation
/// with a growing KV cache (far longer) is planned only in its repeated decode steps.
inline constexpr std::size_t kLoopPlanMaxPeriod = std::size_t{1} << 17;
/// Without stream waits (plan_stream_waits:False, or a backend that cannot): events
/// (allocations and frees) between a free on one stream and a planned reuse of its bytes on
/// another, so the event recorded at the free has had that long to complete. A block whose
/// event has not completed is served by the pool instead. With stream waits: none.
inline constexpr std::uint64_t kLoopPlanCrossStreamMargin = 256;
/// A retired plan's range is cut around the blocks still live in it; free runs shorter than
/// this stay with them (a run under a 2 MiB granule could free no physical memory).
inline constexpr std::size_t kLoopPlanCarveMinGap = 2 * MiB;
/// A plan's packing more than 1% over its live peak re-places its largest long-lived blocks
/// (pack_cyclic): those of at least 1/kPackHeavyShare of the peak, at most kPackMaxPinned of
/// them. Each try packs the blocks of at least 1/kPackTrialShare of the peak (the small ones
/// only fill gaps), at most 2 x pinned x (heavy blocks + 1) tries, under the device lock.
inline constexpr std::size_t kPackHeavyShare = 20;
inline constexpr std::size_t kPackTrialShare = 1000;
inline constexpr std::size_t kPackMaxPinned = 4;
/// A plan is not put in use when its packing wastes more over its live peak than the pool
/// holds reserved over the iteration's allocated peak, plus this many percent of that peak: memory
/// first then serves the loop in less memory, with driver calls (bundled case 02: its best
/// packing is 1.117 of its peak, the pool 1.003; bert_varlen_infer's 1.063 is kept: the pool
/// creeps to more over repeated passes).
inline constexpr std::size_t kPlanSlackPercent = 2;
/// A packing still more than 1% over its live peak then searches swaps of its order (search()
/// in loop_planner.cpp) for at most kPackSearchPerPair x (large blocks)^2 pair checks, and never
/// more than kPackSearchChecks (about 0.2 s once per plan, under the device lock; improve()'s
/// tries have the same bound). Bundled case 12 (50 large blocks) reaches its live peak after
/// 250k-500k.
inline constexpr std::size_t kPackSearchPerPair = 512;
inline constexpr std::size_t kPackSearchChecks = std::size_t{1} << 26;

// --- Whole chunks ------------------------------------------------------------------------------

/// Shortest run of fresh granules made a whole chunk: a one-granule whole chunk is a single
/// granule that could not move as freely.
inline constexpr std::size_t kMinWholeRunGranules = 2;
/// A whole chunk is at most 1/kWholeChunkReservedShare of the memory already reserved: a chunk
/// partly under a live block cannot move, so a small workload gets small chunks, which strand
/// less memory (docs/results.md).
inline constexpr std::size_t kWholeChunkReservedShare = 16;
/// ... but the share never caps a chunk below this, so the first chunks of a process are not a
/// few granules each (one driver call per chunk is what whole chunks save).
inline constexpr std::size_t kWholeChunkMinCap = 32 * MiB;
/// A pool turned memory-first near its limit (whole_chunk_fraction) turns back at a
/// release_cached() that leaves it below this share of that fraction: far enough under it that
/// a job hovering at the fraction does not flip at every empty_cache().
inline constexpr double kMemoryFirstTurnBackShare = 0.5;

// --- Driver calls ------------------------------------------------------------------------------

/// Holes of one request further apart than this many granules get separate access grants: a
/// grant's cost barely grows with its size, but a grant over a long stretch of other mappings
/// costs per mapping it spans (docs/results.md).
inline constexpr std::size_t kMaxAccessGapGranules = 64;

// --- Streams -----------------------------------------------------------------------------------

/// Sweep events in flight per stream: a few let frees become shared in steps while a slow
/// kernel runs; past this many the newest is replaced by one covering the latest frees, so the
/// events held per stream stay bounded without ever waiting.
inline constexpr std::size_t kMaxSweepsPerStream = 4;

/// Completed sweeps whose sharing frees may leave owed to the next request (BlockPool::settle)
/// before a free settles them itself: bounds the list through a long run of frees.
inline constexpr std::size_t kMaxOwedShares = 1024;

// --- Threads -----------------------------------------------------------------------------------

/// Blocks a stream's cache holds at most (besides stream_cache_bytes): a take scans the cache,
/// so it stays a few cache lines; a full cache is drained under the lock.
inline constexpr std::size_t kStreamCacheBlocks = 64;
/// Streams that get a cache (others free under the lock): a power of two hashed by the stream's
/// top 8 bits, far above the streams of one process in practice (cuDNN makes 32).
inline constexpr std::size_t kStreamCacheSlots = 256;
/// Spin-locked stripes of the live table: enough that 16 threads rarely meet on one (each holds
/// a stripe for one table operation); each stripe is one cache line.
inline constexpr std::size_t kLiveTableStripes = 256;

// --- Slabs -------------------------------------------------------------------------------------

/// Most slots one slab has (slab_size / class size): slot indices are 32-bit, and a 1 GiB slab
/// of 512 B slots needs 2^21; 2^24 leaves room for any slab_size accepted.
inline constexpr std::size_t kMaxSlabSlots = std::size_t{1} << 24;

}  // namespace cuarena::detail::tuning
