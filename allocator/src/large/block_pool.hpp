// BlockPool: best-fit blocks over large virtual ranges, physical memory in granules.
//
// Every arena is tiled by Blocks in address order (prev/next). A block is
//   * allocated: handed out; every granule it overlaps is mapped (a lazy block: those its user
//     asked for with back_part()).
//   * owned free: freed on stream S, not yet known to be finished there. Only S may reuse it.
//     In S's size index and S's free-order FIFO. Fully mapped under own-first placement; placed
//     unified (the default) it may have absorbed shared neighbours, holes and all, and give up
//     granules whose frees completed.
//   * shared free: an event recorded on its last stream after the free has completed (or it was
//     never used). Any stream may reuse it, and its wholly-contained mapped granules may be
//     unmapped at once ("stolen") to back another request. In the shared size index and, while
//     it may hold mapped granules, in the LRU list `warm_`. (The free that checks the events
//     leaves their poll and the sharing owed to the next request, settle(): until then the block
//     stays indexed as owned; once polled it merges with nothing, and a free that could absorb it
//     polls and settles first. Segment mode polls and shares at once.)
//   * retired: granule-aligned part of an owned block whose physical granules were re-mapped
//     (aliased) under another request of the same stream. Its old mapping stays until a sweep
//     event on S shows S's earlier work is done; then it is unmapped and becomes shared. In S's
//     retired list only.
// Adjacent free blocks coalesce at once when in the same state (both shared, or both owned by one
// stream), and placed unified an owned block also absorbs the shared neighbours its stream used
// last; never across arenas; the lower-address block object survives a merge.
//
// Physical memory (PhysicalPool) is never created while it can be found: a request first takes
// back its own dormant mappings whose granules are idle; past the soft limit it steals cached
// granules of shared blocks (oldest freed first); idle whole chunks back the runs of holes they
// fit; still short past the soft limit, it aliases granules of its own stream's free blocks
// (stream order makes that safe without waiting); then idle granules; and only then are chunks
// created (BlockPool::ensure_mapped). Mapping reclaimed granules under a fresh virtual range is
// GMLake's stitching (Guo et al., ASPLOS 2024).
//
// Dormant mappings (config dormant_maps): stealing a granule or dropping a retired alias leaves
// its mapping in place, dormant, instead of unmapping it. Only shared free blocks hold dormant
// granules (like unmapped ones, they count as holes). A request over a dormant granule whose
// physical granule is idle takes it back with no driver call, so a repeating workload stops
// paying for map/unmap once every layout it uses has been mapped once.
//
// Layers, one way down: BlockPool decides (placement, frees, sharing, which granules to back
// or take back); StreamSweeps (stream_sweeps.hpp) says how far each stream's work is past its
// frees; Mappings (mappings.hpp) owns the physical memory and makes every memory call to the
// device, by arena and granule, never seeing a block. block_backing.cpp holds the search order
// that backs a request; pool_reports.cpp the read-only walks; pool_invariants.cpp the checks.
//
// Segment mode (a backend without mapping: cudaMalloc, cudaMallocAsync): each arena is one
// segment, backed whole while it exists; nothing is stolen or aliased, and whole free segments
// are returned by release_cached() (the out-of-memory path calls it), as PyTorch does.
//
// Size indexes are ordered sets keyed by (size, address): O(log n) best fit. Nothing on the
// allocation fast path scans all free blocks; steal/alias walk their lists only as far as needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "front/context.hpp"
#include "large/stream_sweeps.hpp"
#include "physical/arena.hpp"
#include "physical/mappings.hpp"
#include "support/intrusive_list.hpp"
#include "support/node_cache.hpp"

namespace cuarena::detail {

struct Block {
  DevicePtr addr = 0;
  std::size_t size = 0;
  Arena* arena = nullptr;
  Block* prev = nullptr;  ///< lower-address neighbour in the arena
  Block* next = nullptr;  ///< higher-address neighbour in the arena
  StreamId stream = 0;    ///< allocation stream, or owning stream while owned/retired
  bool allocated = false;
  bool retired = false;
  bool shared = false;  ///< free and usable by every stream
  bool used = false;    ///< has ever been allocated (for cross-stream reuse counting)
  /// Backed part by part (a planned range, BlockPool::reserve_lazy): may lack granules even
  /// while allocated or owned. Cleared when the block is next handed out or shared.
  bool lazy = false;
  bool addressed = false;      ///< has its entry in BlockPool::free_by_addr_
  std::uint64_t free_seq = 0;  ///< owner stream's free sequence number at free/retire time
  Link<Block> fifo;            ///< owner's FIFO (owned free) or retired list
  Link<Block> lru;             ///< warm_ (shared free blocks that may hold mapped granules)
  DevicePtr end() const { return addr + size; }
  bool is_free() const { return !allocated && !retired; }
};

struct BySize {
  using is_transparent = void;
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
  bool operator()(const Block* a, std::size_t size) const { return a->size < size; }
  bool operator()(std::size_t size, const Block* b) const { return size < b->size; }
};
using SizeIndex = std::set<Block*, BySize, CachedAllocator<Block*>>;
using AddressIndex =
    std::map<DevicePtr, Block*, std::less<>, CachedAllocator<std::pair<const DevicePtr, Block*>>>;

class BlockPool {
 public:
  explicit BlockPool(Context& ctx)
      : ctx_(ctx),
        mappings_(ctx),
        sweeps_(ctx.backend, ctx.stats),
        segments_(!ctx.backend.supports_mapping()),
        merged_(!segments_ && (ctx.config.whole_chunk_min == 0 || unified_by_config())) {
    if (!segments_ && ctx.config.whole_chunk_min == 0) ctx_.stats.memory_first = 1;
  }
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// Allocates `size` bytes (a multiple of 512) for `stream`, backing what it lacks. Returns
  /// nullptr, having changed nothing but caches, when the limit or the device refuses; throws
  /// BackendError.
  Block* try_allocate(std::size_t size, StreamId stream);

  /// Frees an allocated block on its stream: owned by that stream, coalesced with its owned
  /// neighbours.
  void deallocate(Block* block);

  /// An allocated block of `size` bytes (a multiple of 512) at the start of fresh address
  /// space, with no memory: its user backs the parts it uses with back_part(), and memory comes
  /// as it would for any request (dormant mappings, idle or stolen granules, then new ones), so
  /// the range never holds memory for parts not yet used. A segment backend cannot map part of
  /// a range: there the block comes backed whole (try_allocate). Returns nullptr as
  /// try_allocate() does; throws BackendError.
  Block* reserve_lazy(std::size_t size, StreamId stream);
  /// Backs [addr, addr+size) of lazy allocated block b for `stream` (a no-op where it is
  /// backed). False, having changed nothing but caches, when the limit or the device refuses.
  bool back_part(Block* b, DevicePtr addr, std::size_t size, StreamId stream);
  /// True when every granule [addr, addr+size) of b's arena overlaps is mapped.
  bool backed(const Block* b, DevicePtr addr, std::size_t size) const;

  /// Splits allocated block b at `at` (a 512-byte multiple strictly inside it): b keeps
  /// [addr, at), the returned allocated block holds [at, end). Nothing is mapped or unmapped;
  /// each part may then be freed on its own. O(1).
  Block* split_allocated(Block* b, DevicePtr at);

  /// Records a sweep event on every stream with unswept blocks and none pending. Non-blocking.
  void record_sweeps();
  /// Turns the blocks covered by completed sweep events into shared blocks. Non-blocking.
  void poll_sweeps();
  /// Blocks until every stream's free and retired blocks are shared (out-of-memory path).
  void synchronize();
  /// Shares what completed sweeps cover and frees left owed (lazy_shares()), in the order they
  /// completed. Every entry point but deallocate() calls it first, so requests see the pool as if
  /// it had shared at the frees; readers of its state do not (they make no driver call), and see
  /// owed sharing as such (breakdown() counts an owed block as shared). Its driver calls are
  /// those sharing makes: unmapping dropped aliases (dormant_maps:0) and dormant mappings past
  /// their cap; it throws BackendError if one fails.
  void settle();
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

  /// Unmaps every cached granule of shared blocks and releases idle chunks (segment mode: frees
  /// every wholly free shared segment, then trims the upstream). Returns bytes released.
  std::size_t release_cached();
  bool segment_mode() const { return segments_; }

  std::size_t free_block_count() const { return free_blocks_; }
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
  /// Walks [lo, hi) of `a` granule by granule: mapped bytes extend `run` and `total`, an
  /// unmapped granule ends the run (raising `largest`).
  static void scan_mapped(const Arena& a, DevicePtr lo, DevicePtr hi, std::size_t& run,
                          std::size_t& total, std::size_t& largest);
  /// A stream's free blocks; its sweep state (free numbers, events) is the base.
  struct StreamPool : StreamSweeps::Stream {
    explicit StreamPool(NodeCache* nodes) : free(CachedAllocator<Block*>(nodes)) {}
    SizeIndex free;
    IntrusiveList<Block, &Block::fifo> fifo;     // owned free blocks, sorted by free_seq
    IntrusiveList<Block, &Block::fifo> retired;  // retired blocks, sorted by free_seq
    /// Frees up to this number may be shared once owed_'s unpolled entry of the stream is polled
    /// (what its sweeps cover); 0: the stream has no unpolled entry.
    std::uint64_t unpolled_reach = 0;
  };

  StreamPool& stream_pool(StreamId stream) {
    // Consecutive calls are mostly for one stream: skip the hash lookup then. (streams_ is a
    // node-based map whose entries are never erased, so the pointer stays valid.)
    if (last_sp_ == nullptr || stream != last_stream_) {
      last_sp_ = &streams_.try_emplace(stream, &size_nodes_).first->second;
      last_sp_->id = stream;
      last_stream_ = stream;
    }
    return *last_sp_;
  }
  /// A new arena holding at least `min_size` bytes as one shared free block; nullptr when a
  /// segment backend refuses.
  Block* new_arena(std::size_t min_size, StreamId stream);
  Block* new_segment(std::size_t min_size, StreamId stream);
  Block* add_arena_block();  // the free block tiling the newest arena
  std::size_t release_free_segments();

  /// Indexes a detached block by its state. Owned blocks go before `fifo_pos` in their stream's
  /// FIFO (at the back when null), retired ones at the back of its retired list; shared ones
  /// join warm_ when `warm`.
  void insert_free(Block* b, Block* fifo_pos = nullptr, bool warm = true);
  /// Takes b out of its indexes. `keep_address`: b stays free at its address (it is re-inserted
  /// or absorbs its neighbours), so its free_by_addr_ entry stays, saving a map erase and insert.
  void remove_free(Block* b, bool keep_address = false);
  /// Free blocks in free_by_addr_: shared ones (but segments), owned ones placed unified.
  bool addressable(const Block* b) const {
    return !b->allocated && !b->retired && (b->shared ? !segments_ : merged_);
  }
  /// Gives b its free_by_addr_ entry if addressable(b), else takes it away.
  void index_address(Block* b);
  void unaddress(Block* b) {
    if (!b->addressed) return;
    free_by_addr_.erase(b->addr);
    b->addressed = false;
  }
  bool mergeable(const Block* a, const Block* b) const;
  Block* coalesce(Block* b);  // merges detached free b with its neighbours
  /// Folds `upper` into its lower neighbour `lower` and deletes it. The lower-address object
  /// survives, so an arena's first block never goes away.
  void absorb(Block* lower, Block* upper);
  /// Block objects come from and go back to block_nodes_ (a split or a merge on most calls).
  Block* new_block() { return new (block_nodes_.take(sizeof(Block))) Block; }
  void delete_block(Block* b) {
    b->~Block();
    block_nodes_.give(b, sizeof(Block));
  }
  Block* split_off(Block* b, DevicePtr at);  // b keeps [addr, at); returns [at, end)
  void make_shared(Block* b);
  /// Stamps the granules b covers with its stream and free_seq (Arena::FreeStamp).
  void stamp(const Block* b);

  /// Frees share lazily: the check a free makes every sweep_interval frees leaves its poll and
  /// the sharing of what completed owed (owed_, an unpolled entry), and every entry point but
  /// deallocate() settles first, so requests see the pool as if the check had polled and shared
  /// (the poll, later, sees at least as much of the device's progress). The free pays only the
  /// sweep's record. A block owed merges with nothing (mergeable()); a free whose coalescing
  /// could reach a block an unpolled entry may owe polls first (near()). Placed unified, a free
  /// also absorbs shared neighbours, so a free whose coalescing could reach a block owed settles
  /// first (near()), and sharing puts blocks in warm_ where the check stood (a sentinel). At lag 1
  /// this kept every placement and driver call of polling at the check on the bundled traces
  /// (docs/results.md). Segment mode shares at once (its frees absorb any shared neighbour).
  bool lazy_shares() const { return !segments_; }
  /// The stream pool of b if b is an owned free or retired block, else nullptr.
  const StreamPool* free_owner(const Block* b) const;
  /// b is an owned free or retired block that a completed sweep covers, its sharing owed.
  bool owes(const Block* b) const;
  /// b is an owned free or retired block that its stream's unpolled entry would cover if its
  /// sweeps completed: owes(b) is known only once they are polled.
  bool unpolled(const Block* b) const;
  struct Owed;
  /// Polls the sweeps unpolled entry `o` stands for (the oldest o.polls in flight), fixing what it
  /// covers. Precondition: no other poll of the stream since the check that left it.
  void poll_owed(Owed& o);
  /// poll_owed() on every unpolled entry.
  void poll_unpolled();
  /// Coalescing detached free block b could meet a block `pred` holds for: a neighbour (free or
  /// retired), or a shared neighbour (coalesced, so its far neighbour is not shared) next to one.
  template <class Pred>
  bool near(const Block* b, Pred&& pred) const;
  /// A sentinel at the back of warm_, for the sharing a free leaves owed; drop_sentinel() takes it
  /// out again once that sharing is done.
  Block* push_sentinel();
  void drop_sentinel(Block* sentinel);
  /// Records a sweep on sp's stream if it has free or retired blocks no completed sweep covers.
  void start_sweep(StreamPool& sp) {
    const auto uncovered = [&](const IntrusiveList<Block, &Block::fifo>& l) {
      return !l.empty() && l.back()->free_seq > sp.done;  // sorted: the back is the newest
    };
    if (uncovered(sp.fifo) || uncovered(sp.retired)) sweeps_.record(sp);
  }
  /// Retires the stream's completed sweeps (oldest first), sharing the blocks they cover.
  void poll_stream(StreamPool& sp);
  /// Shares sp's free and retired blocks freed up to number `covered` (a completed sweep).
  void share_covered(StreamPool& sp, std::uint64_t covered);

  /// Granule g of `a` lies in free memory whose last user is finished with it: its physical
  /// granule may be mapped elsewhere (Arena::FreeStamp).
  bool finished(const Arena& a, std::size_t g) const;
  /// The free block wholly holding virtual granule g of `a` whose last user is finished with g
  /// (a shared block, or an owned one where finished()), or nullptr. O(log n).
  const Block* free_holder(const Arena& a, std::size_t g) const;
  /// The free block to serve `size` from among those `sp`'s stream may use (its own and the
  /// shared ones; see the .cpp), or nullptr. O(log n + candidates x granules). Unified
  /// placement places with it; own-first when none of the stream's own blocks fits.
  /// Sets `mapped` when the block's first `size` bytes need nothing backed (every granule
  /// active).
  Block* best_fit(StreamPool& sp, std::size_t size, bool& mapped);
  /// The same for own-first placement: the stream's own best fit, unless a tighter shared block
  /// needs no new memory; on a miss, the shared fit missing fewest granules among the few smallest.
  Block* own_then_shared(StreamPool& sp, std::size_t size, bool& mapped);
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
  /// Reserved bytes past which cached memory is reused before any is created.
  std::size_t soft_limit() const;
  /// Bytes to create for r's holes if `have` granules were found for them.
  std::size_t shortfall(const Backing& r, std::size_t have) const;
  /// Past the soft limit: steals cached granules of shared free blocks (oldest freed first)
  /// for the holes, and takes back the dormant mappings that frees. True when no hole is left.
  bool reuse_cached(Block* b, Backing& r);
  /// Still short past the soft limit: maps the stream's own free memory under the holes
  /// wholly inside the request too (aliases; safe in stream order), when that lets it fit.
  void alias_own(Backing& r, StreamId stream, std::size_t soft);
  /// Takes back dormant mappings, for holes of detached block b's arena, and files the free
  /// neighbours a whole chunk spilled into (they now cache active granules) for steal().
  void reactivate(Block* b, std::vector<std::size_t>& holes);
  /// Unmaps cached granules of shared blocks until `target` granules are idle.
  void steal(std::size_t target);
  enum class Take {
    kMovable,   ///< movable granules only
    kWholeToo,  ///< also whole chunks lying wholly inside (they become idle whole chunks)
    kAll,       ///< everything inside, unmapped (release_cached)
  };
  /// Frees cached granules wholly inside shared block b, from the top, until `max_granules`
  /// have become idle (kAll: all, unmapped; otherwise made dormant where dormant_maps allows).
  /// Leaves b in warm_ while it still holds stealable granules.
  void unmap_interior(Block* b, std::size_t max_granules, Take take);
  /// Retires whole chunks lying wholly inside `sp`'s owned blocks (oldest freed first) to back
  /// runs of the holes listed in `open` (indexes into `holes`, wholly inside the request) that
  /// they fit, up to about `want` granules; fills `supply`. Returns the granules so backed.
  std::size_t alias_whole(StreamPool& sp, const std::vector<std::size_t>& holes,
                          const std::vector<std::size_t>& open, std::size_t want,
                          std::vector<PhysRef>& supply);
  /// Splits `sp`'s owned block f into [f, g0) owned, granules [g0, g1) retired (their
  /// physical memory now backs another request of the stream too), and the rest owned.
  void retire(StreamPool& sp, Block* f, std::size_t g0, std::size_t g1);
  /// Granules of `sp`'s owned blocks that alias() could take, up to `max`.
  std::size_t aliasable(const StreamPool& sp, std::size_t max) const;
  /// Retires up to `want` granules of `sp`'s owned blocks, appending their physical granules.
  std::size_t alias(StreamPool& sp, std::size_t want, std::vector<PhysRef>& out);
  /// The free block holding all of p's only active mapping (all of its whole chunk's), finished
  /// there (free_holder), or nullptr.
  const Block* active_holder(PhysRef p) const;
  /// For hole granules whose dormant physical granule is active only inside a shared free
  /// block, makes that mapping dormant instead (no driver call), so reactivate() can take it.
  void reclaim_dormant(const Arena& a, const std::vector<std::size_t>& holes);
  Mappings::Extent mapping_extent(PhysRef p, std::size_t g) const { return mappings_.extent(p, g); }

  Context& ctx_;
  Mappings mappings_;  // the physical memory and every memory call to the device
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::vector<Block*> arena_first_;  // block at each arena's base; never merged away
  // Before the indexes: their nodes go back to these when they are destroyed.
  NodeCache size_nodes_;     // SizeIndex nodes (shared_free_, every stream's free)
  NodeCache address_nodes_;  // free_by_addr_'s nodes
  NodeCache block_nodes_;    // Block objects
  std::unordered_map<StreamId, StreamPool> streams_;
  StreamSweeps sweeps_;  // after streams_: its destructor releases their events in flight
  SizeIndex shared_free_{CachedAllocator<Block*>(&size_nodes_)};
  AddressIndex free_by_addr_{// shared and owned free blocks by address
                             CachedAllocator<std::pair<const DevicePtr, Block*>>(&address_nodes_)};
  IntrusiveList<Block, &Block::lru> warm_;  // LRU: front = freed longest ago
  // Sharing owed by sweeps, in the order of the checks that polled them or left them unpolled:
  // the stream, the free number covered (0 until polled), (placed unified) the sentinel in warm_
  // where the check stood, and the sweeps left unpolled: the oldest `polls` in flight (0: polled).
  // A stream has at most one unpolled entry (sp->unpolled_reach != 0).
  struct Owed {
    StreamPool* sp;
    std::uint64_t covered;
    Block* sentinel;
    std::size_t polls;
  };
  std::vector<Owed> owed_;
  std::vector<std::unique_ptr<Block>> sentinels_;  // every sentinel made
  std::vector<Block*> spare_sentinels_;            // those not in warm_
  Block* warm_before_ = nullptr;                   // while settling: where shared blocks join warm_
  std::size_t free_blocks_ = 0;
  StreamId last_stream_ = 0;  // stream_pool()'s one-entry cache
  StreamPool* last_sp_ = nullptr;
  const bool segments_;  // segment mode: the backend cannot map
  // Unified placement (the default, and always with memory first): an owned block absorbs
  // shared neighbours its stream used, placement is one best fit over the stream's own and the
  // shared blocks (best_fit), and finished granules of owned blocks can be stolen
  // (Arena::FreeStamp). Less memory, steadier across device lags; placement:own_first keeps
  // owned blocks fully mapped and tries them first (own_then_shared), for fewer instructions.
  bool merged_;
  bool unified_by_config() const { return ctx_.config.placement == Placement::kUnified; }
  bool turned_ = false;  // memory-first by turn_memory_first(), not by the config
};

}  // namespace cuarena::detail
