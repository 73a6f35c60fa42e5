// BlockPool: best-fit blocks over large virtual ranges, physical memory in granules.
//
// The pool decides: which free block serves a request (Placement, placement.hpp), what a free
// does, when freed blocks become shared (Sharing, sharing.hpp), and which granules to back or
// take back. Its blocks and their indexes are the FreeIndex's (free_index.hpp, where the block
// states are described); StreamSweeps (stream_sweeps.hpp) says how far each stream's work is
// past its frees; Mappings (mappings.hpp) owns the physical memory and makes every memory call
// to the device, by arena and granule, never seeing a block. Layers, one way down.
//
// An allocated block has every granule it overlaps mapped (a lazy block: those its user asked
// for with back_part()). A shared free block may lack granules, and its wholly-contained mapped
// granules may be unmapped at once to back another request (defragmentation); placed unified,
// so may the finished granules of an owned block that absorbed shared memory.
//
// How a request is backed, and dormant mappings: block_backing.cpp.
//
// Segment mode (a backend without mapping: cudaMalloc, cudaMallocAsync): each arena is one
// segment, backed whole while it exists; nothing is defragmented or aliased, and whole free
// segments are returned by release_cached() (the out-of-memory path calls it), as PyTorch does.
//
// pool_reports.cpp holds the read-only walks, pool_invariants.cpp the checks. Nothing on the
// allocation fast path scans all free blocks; defragmentation and aliasing walk their lists
// only as far as needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "front/context.hpp"
#include "large/free_index.hpp"
#include "large/placement.hpp"
#include "large/sharing.hpp"
#include "physical/arena.hpp"
#include "physical/mappings.hpp"

namespace cuarena::detail {

/// Memory that a user of lazy blocks holds mapped under no block of its own (a loop plan's
/// range between its blocks: LazyReclaimer is PlanServer). Before it grows past the defrag
/// threshold, the pool asks it for such granules (BlockPool::idle_unused), so memory a plan
/// holds for requests that did not come backs the requests that did.
class LazyReclaimer {
 public:
  /// Makes up to `granules` granules idle for a request of `stream`, taking only memory whose
  /// last user's work is ordered before that stream's next (the same stream). Returns how many
  /// became idle. Called under the device lock, from inside the pool.
  virtual std::size_t reclaim(std::size_t granules, StreamId stream) = 0;

 protected:
  ~LazyReclaimer() = default;
};

class BlockPool {
 public:
  explicit BlockPool(Context& ctx);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// Allocates `size` bytes (a multiple of 512) for `stream`, backing what it lacks, at an
  /// address that is a multiple of `alignment` (a power of two). Returns nullptr, having changed
  /// nothing but caches, when the limit or the device refuses; throws BackendError.
  Block* try_allocate(std::size_t size, StreamId stream, std::size_t alignment = kMinBlockSize);

  /// Frees an allocated block on its stream: owned by that stream, coalesced with its owned
  /// neighbours.
  void deallocate(Block* block);

  /// An allocated block of `size` bytes (a multiple of 512) at the start of fresh address
  /// space, with no memory: its user backs the parts it uses with back_part(), and memory comes
  /// as it would for any request (dormant mappings, idle or defragmented granules, then new ones),
  /// so the range never holds memory for parts not yet used. A segment backend cannot map part of
  /// a range: there the block comes backed whole (try_allocate). Returns nullptr as
  /// try_allocate() does, or when the backend has no address space left for a new arena;
  /// throws BackendError.
  Block* reserve_lazy(std::size_t size, StreamId stream);
  /// Backs [addr, addr+size) of lazy allocated block b for `stream` (a no-op where it is
  /// backed). False, having changed nothing but caches, when the limit or the device refuses.
  bool back_part(Block* b, DevicePtr addr, std::size_t size, StreamId stream);
  /// True when every granule [addr, addr+size) of b's arena overlaps is mapped.
  bool backed(const Block* b, DevicePtr addr, std::size_t size) const;
  /// Precondition: no live data lies in [lo, hi) of lazy allocated block b, and its last user's
  /// work there is ordered before any later use of the memory. Frees the actively mapped
  /// granules wholly inside [lo, hi) (a whole chunk only if all of it lies there), from the
  /// top, until `max_granules` became idle: dormant where dormant_maps allows (no driver call;
  /// back_part takes them back if still idle), else unmapped. Returns the granules made idle;
  /// appends the address of each granule whose mapping it retired to `taken`.
  std::size_t idle_unused(Block* b, DevicePtr lo, DevicePtr hi, std::size_t max_granules,
                          std::vector<DevicePtr>& taken);
  /// Who holds lazy memory the pool may ask for before growing (nullptr: nobody). `r` must
  /// outlive the pool or be reset first.
  void set_reclaimer(LazyReclaimer* r) { reclaimer_ = r; }

  /// Splits allocated block b at `at` (a 512-byte multiple strictly inside it): b keeps
  /// [addr, at), the returned allocated block holds [at, end). Nothing is mapped or unmapped;
  /// each part may then be freed on its own. O(1).
  Block* split_allocated(Block* b, DevicePtr at);

  /// Whether a stream other than `stream` holds owned free or retired blocks (memory a sweep
  /// would let anyone reuse). O(streams).
  bool others_hold_frees(StreamId stream) const;
  /// Makes the smallest owned free block of another stream that holds `size` bytes at
  /// `alignment` `stream`'s: an event recorded on its stream S now, `stream` made to wait for
  /// it on the device (the host does not block), then the block freed again on `stream` (its
  /// newest free, coalesced). Neither `stream` nor S may be under graph capture
  /// (DeviceBackend::stream_capturing): such a stream is passed over. True when a block was
  /// taken; false when none fits or the backend cannot order streams. O(streams x log blocks).
  bool adopt_free(StreamId stream, std::size_t size, std::size_t alignment);

  /// Records a sweep event on every stream with unswept blocks and none pending. Non-blocking.
  void record_sweeps() { sharing_.record_sweeps(); }
  /// Turns the blocks covered by completed sweep events into shared blocks. Non-blocking.
  void poll_sweeps() { sharing_.poll_sweeps(); }
  /// Blocks until every stream's free and retired blocks are shared (out-of-memory path).
  void synchronize() { sharing_.synchronize(); }

  /// Unmaps every cached granule of shared blocks and releases idle chunks (segment mode: frees
  /// every wholly free shared segment, then trims the upstream). Returns bytes released.
  std::size_t release_cached();
  bool segment_mode() const { return segments_; }

  std::size_t free_block_count() const { return index_.size(); }
  /// True when `addr` lies in address space this pool reserved. O(arenas).
  bool owns(DevicePtr addr) const {
    for (const auto& a : arenas_) {
      if (addr >= a->base() && addr < a->base() + a->size()) return true;
    }
    return false;
  }

  /// Free bytes inside mapped granules, and the largest contiguous run of them.
  void free_mapped_extents(std::size_t& total, std::size_t& largest) const;
  /// Adds the bytes of [lo, hi) (inside block b) that mapped granules back to `total`, and
  /// raises `largest` to the longest contiguous such run there.
  void mapped_extents(const Block* b, DevicePtr lo, DevicePtr hi, std::size_t& total,
                      std::size_t& largest) const;

  /// Appends every maximal run of actively mapped granules (a whole segment in segment mode)
  /// as (address, bytes), in arena order. O(mapped granules): for snapshots.
  void mapped_runs(std::vector<std::pair<DevicePtr, std::size_t>>& out) const;

  /// Throws std::logic_error naming the first broken invariant.
  void check_invariants() const;

  /// Where the physical memory is, in bytes: under allocated blocks, cached in owned free
  /// blocks, cached in shared free blocks, held by retired aliases, idle. O(mapped granules).
  struct Breakdown {
    std::size_t allocated = 0, owned = 0, shared = 0, retired = 0, idle = 0;
  };
  Breakdown breakdown() const;

 private:
  /// Turns the pool memory-first (as whole_chunk_min:0): no new whole chunks, and unified
  /// placement if it was own-first. For a pool that ran short of memory: fewer bytes for more
  /// driver calls. It stays so until release_cached() leaves it holding less than half of where
  /// it turned. A no-op in segment mode or when already memory-first.
  void turn_memory_first();
  /// True while turn_memory_first() would change something: a mapping pool with whole chunks
  /// that has not turned.
  bool can_turn_memory_first() const {
    return !turned_ && !segments_ && ctx_.config.whole_chunk_min != 0;
  }
  /// Walks [lo, hi) of `a` granule by granule: mapped bytes extend `run` and `total`, an
  /// unmapped granule ends the run (raising `largest`).
  static void scan_mapped(const Arena& a, DevicePtr lo, DevicePtr hi, std::size_t& run,
                          std::size_t& total, std::size_t& largest);
  /// A new arena holding at least `min_size` bytes as one shared free block; nullptr when a
  /// segment backend refuses.
  Block* new_arena(std::size_t min_size, StreamId stream);
  Block* new_segment(std::size_t min_size, StreamId stream);
  Block* add_arena_block();  // the free block tiling the newest arena
  std::size_t release_free_segments();
  /// The placement the pool's mode says (placement.hpp).
  const BlockPlacement& placement() const {
    return index_.unified() ? *unified_placement_ : *own_first_placement_;
  }
  /// FreeIndex::coalesce under the pool's rules: owed blocks wait (Sharing), an owned block
  /// absorbs the shared neighbours its placement takes in (any, in segment mode).
  Block* coalesce(Block* b);
  /// Whether b may lack granules, so that placing it must check (ensure_mapped).
  bool needs_backing(const Block* b) const;
  /// Turns owned free or retired block b (still indexed) into a shared one: drops a retired
  /// block's alias, clears its stamps, coalesces it (Sharing calls it).
  void make_shared(Block* b);
  /// Stamps the granules b covers with its stream and free_seq (Arena::FreeStamp).
  void stamp(const Block* b);

  /// Granule g of `a` lies in free memory whose last user is finished with it: its physical
  /// granule may be mapped elsewhere (Arena::FreeStamp).
  bool finished(const Arena& a, std::size_t g) const;
  /// The free block wholly holding virtual granule g of `a` whose last user is finished with g
  /// (a shared block, or an owned one where finished()), or nullptr. O(log n).
  const Block* free_holder(const Arena& a, std::size_t g) const;
  /// Granules of [b->addr, b->addr+size) neither mapped nor coming back with no driver call,
  /// counted up to `limit` (the scan stops there: callers only compare against it).
  /// `unmapped`, when given, gets the granules not active there (missing or dormant), counted
  /// in full unless the scan stopped at `limit`.
  std::size_t missing_granules(const Block* b, std::size_t size, std::size_t limit = SIZE_MAX,
                               std::size_t* unmapped = nullptr) const;
  /// Backs [addr, addr+size) of detached (or lazy allocated) block b for `stream`; false if
  /// refused. The search order, as a few calls: see the .cpp.
  bool ensure_mapped(Block* b, DevicePtr addr, std::size_t size, StreamId stream);
  /// ensure_mapped's steps. The holes (unmapped granules) of the request's range.
  Backing holes_of(const Block* b, DevicePtr addr, std::size_t size) const;
  /// Takes back the holes' dormant mappings whose physical granules are idle or cached in a
  /// shared free block (no driver call). True when no hole is left.
  bool take_back_dormant(Block* b, Backing& r);
  /// Reserved bytes past which cached memory is reused before any is created (config
  /// defrag_threshold, raised by the cache slack over the peak of allocated bytes).
  std::size_t defrag_threshold() const;
  /// Bytes to create for r's holes if `have` granules were found for them.
  std::size_t shortfall(const Backing& r, std::size_t have) const;
  /// Past the defrag threshold: defragments (defrag_pass) for the holes, and takes back the
  /// dormant mappings that frees. True when no hole is left.
  bool defrag(Block* b, Backing& r);
  /// Still short past the defrag threshold (`threshold`): maps the stream's own free memory
  /// under the holes wholly inside the request too (aliases; safe in stream order), when that
  /// lets it fit.
  void alias_own(Backing& r, StreamId stream, std::size_t threshold);
  /// Lets an alias back r's top edge granule (sticking out of [addr, addr+size), the end of
  /// detached block b) when the rest of it lies in the free block above b: widens r's inside
  /// range over it (Backing::edge).
  /// Memory first only: placing whole chunks, it held more on most bundled traces (gpt2_train
  /// 1.0291 -> 1.0368, cnn_varres_infer 1.0462 -> 1.0686; docs/results.md, 2026-12-07 (night)).
  void aliasable_edge(const Block* b, DevicePtr addr, std::size_t size, Backing& r) const;
  /// After the top edge granule of b may have taken an alias: the free rest of it becomes
  /// `stream`'s, freed now, so no other stream touches the aliased physical memory before the
  /// stream's earlier work on it is done (the same wait a retired block's old mapping gets).
  void claim_edge(Block* b, const Backing& r, StreamId stream);
  /// Files detached free block b as freed now on sp's stream: owned by it, with its newest free
  /// number (stamped), coalesced with its owned neighbours. No sweep bookkeeping (after_free).
  void free_now(Block* b, StreamFreeLists& sp);
  /// Takes back dormant mappings, for holes of detached block b's arena, and files the free
  /// neighbours a whole chunk spilled into (they now cache active granules) for defrag_pass().
  void reactivate(Block* b, std::vector<std::size_t>& holes);
  /// One defragmentation pass: frees cached granules of the blocks in warm() (oldest freed
  /// first) until `target` granules are idle.
  void defrag_pass(std::size_t target);
  enum class Take {
    kMovable,   ///< movable granules only
    kWholeToo,  ///< also whole chunks lying wholly inside (they become idle whole chunks)
    kAll,       ///< everything inside, unmapped (release_cached)
  };
  /// Frees cached granules wholly inside shared block b, from the top, until `max_granules`
  /// have become idle (kAll: all, unmapped; otherwise made dormant where dormant_maps allows).
  /// Leaves b in warm() while it still holds granules to take.
  void unmap_interior(Block* b, std::size_t max_granules, Take take);
  /// Retires whole chunks lying wholly inside `sp`'s owned blocks (oldest freed first) to back
  /// runs of the holes listed in `open` (indexes into `holes`, wholly inside the request) that
  /// they fit, up to about `want` granules; fills `supply`. Returns the granules so backed.
  std::size_t alias_whole(StreamFreeLists& sp, const std::vector<std::size_t>& holes,
                          const std::vector<std::size_t>& open, std::size_t want,
                          std::vector<PhysRef>& supply);
  /// Splits `sp`'s owned block f into [f, g0) owned, granules [g0, g1) retired (their
  /// physical memory now backs another request of the stream too), and the rest owned.
  void retire(StreamFreeLists& sp, Block* f, std::size_t g0, std::size_t g1);
  /// Granules of `sp`'s owned blocks that alias() could take, up to `max`.
  std::size_t aliasable(const StreamFreeLists& sp, std::size_t max) const;
  /// Retires up to `want` granules of `sp`'s owned blocks, appending their physical granules.
  std::size_t alias(StreamFreeLists& sp, std::size_t want, std::vector<PhysRef>& out);
  /// The free block holding all of p's only active mapping (all of its whole chunk's), finished
  /// there (free_holder), or nullptr.
  const Block* active_holder(PhysRef p) const;
  /// For hole granules whose dormant physical granule is active only inside a shared free
  /// block, makes that mapping dormant instead (no driver call), so reactivate() can take it.
  void reclaim_dormant(const Arena& a, const std::vector<std::size_t>& holes);
  Mappings::Extent mapping_extent(PhysRef p, std::size_t g) const { return mappings_.extent(p, g); }

  Context& ctx_;
  Mappings mappings_;  // the physical memory and every memory call to the device
  std::vector<std::unique_ptr<Arena>> arenas_;  // index_.firsts() holds their first blocks
  const bool segments_;                         // segment mode: the backend cannot map
  FreeIndex index_;                             // the blocks; unified(): unified placement
  Sharing sharing_;                             // after index_: it holds its streams' events
  std::unique_ptr<BlockPlacement> unified_placement_, own_first_placement_;
  bool turned_ = false;  // memory-first by turn_memory_first(), not by the config
  LazyReclaimer* reclaimer_ = nullptr;
  std::vector<std::pair<Block*, StreamFreeLists*>> adopt_candidates_;  // adopt_free's scratch
};

}  // namespace cuarena::detail
