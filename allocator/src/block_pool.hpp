// BlockPool: best-fit blocks over large virtual ranges, physical memory in granules.
//
// Every arena is tiled by Blocks in address order (prev/next). A block is allocated or free.
// A free block is either
//   * owned by stream S: freed on S and not yet known to be finished there. Only S may reuse
//     it. It sits in S's size index and in S's free-order FIFO. It is fully mapped.
//   * shared: an event recorded on its last stream after the free has completed (or it was
//     never used). Any stream may reuse it, and its wholly-contained mapped granules may be
//     unmapped ("stolen") to back another request. It sits in the shared size index and, while
//     it may hold mapped granules, in the LRU list `warm_`.
// Adjacent free blocks are coalesced at once when they are in the same state (both shared, or
// both owned by the same stream); blocks never merge across arenas.
//
// Physical memory: a granule is mapped iff it overlaps an allocated block, or it is cached in a
// free block. Allocation maps only what the chosen range lacks; when mapping would pass the soft
// limit, cached granules of shared blocks are stolen first (oldest freed first), so memory moves
// to where it is needed instead of growing. This is GMLake's "stitching" (Guo et al., ASPLOS
// 2024) done by remapping granules under a fresh part of the virtual range.
//
// Size indexes are ordered sets keyed by (size, address): O(log n) best fit. Nothing scans all
// free blocks on the allocation path; stealing walks the LRU list only as far as it must.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "arena.hpp"
#include "context.hpp"
#include "intrusive_list.hpp"

namespace cuarena::detail {

struct Block {
  DevicePtr addr = 0;
  std::size_t size = 0;
  Arena* arena = nullptr;
  Block* prev = nullptr;  ///< lower-address neighbour in the arena
  Block* next = nullptr;  ///< higher-address neighbour in the arena
  StreamId stream = 0;    ///< allocation stream, or owning stream while owned-free
  bool allocated = false;
  bool shared = false;    ///< free and usable by every stream
  bool used = false;      ///< has ever been allocated (for cross-stream reuse counting)
  std::uint64_t free_seq = 0;  ///< owner stream's free sequence number at free time
  Link<Block> fifo;            ///< owner's free-order list (owned free blocks)
  Link<Block> lru;             ///< warm_ (shared free blocks that may hold mapped granules)
};

struct BySize {
  using is_transparent = void;
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
  bool operator()(const Block* a, std::size_t size) const { return a->size < size; }
  bool operator()(std::size_t size, const Block* b) const { return size < b->size; }
};
using SizeIndex = std::set<Block*, BySize>;

class BlockPool {
 public:
  explicit BlockPool(Context& ctx) : ctx_(ctx) {}
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// Allocates `size` bytes (a multiple of 512) for `stream`, mapping what it lacks. Steals
  /// cached granules of shared blocks when over the soft limit. Returns nullptr, changing
  /// nothing but caches, when the hard limit or the device refuses; throws BackendError.
  Block* try_allocate(std::size_t size, StreamId stream);

  /// Frees an allocated block on its stream: owned by that stream, coalesced with its owned
  /// neighbours.
  void deallocate(Block* block);

  /// Records a sweep event on every stream with unswept free blocks and none pending.
  void record_sweeps();
  /// Turns the owned blocks covered by completed sweep events into shared blocks.
  void poll_sweeps();
  /// Blocks until every stream's free blocks are shared (out-of-memory path).
  void synchronize();

  /// Unmaps every cached granule of shared blocks. Returns bytes released.
  std::size_t release_cached();

  /// Number of free blocks (owned and shared).
  std::size_t free_block_count() const { return free_blocks_; }

  /// Free bytes inside mapped granules, and the largest contiguous run of them.
  void free_mapped_extents(std::size_t& total, std::size_t& largest) const;

  /// Throws std::logic_error naming the first broken invariant.
  void check_invariants() const;

  std::size_t arena_count() const { return arenas_.size(); }

 private:
  struct StreamPool {
    SizeIndex free;
    IntrusiveList<Block, &Block::fifo> fifo;  // sorted by free_seq
    std::uint64_t seq = 0;
    bool sweep_pending = false;
    EventId sweep_event = 0;
    std::uint64_t sweep_seq = 0;
  };

  StreamPool& stream_pool(StreamId stream);
  Block* best_fit(const SizeIndex& index, std::size_t size) const;
  Block* new_arena(std::size_t min_size);

  /// Indexes a detached free block by its state. Owned blocks go before `fifo_pos` in their
  /// stream's FIFO (at the back when null); shared ones join warm_ when `warm`.
  void insert_free(Block* b, Block* fifo_pos = nullptr, bool warm = true);
  void remove_free(Block* b);
  void make_shared(Block* b);
  Block* coalesce(Block* b);  // merges detached free b with mergeable neighbours
  static bool mergeable(const Block* a, const Block* b);

  /// Maps the unmapped granules under [b->addr, b->addr+size); false if the limit or the
  /// device refuses (having released only cached granules).
  bool ensure_mapped(Block* b, std::size_t size);
  std::size_t steal(std::size_t bytes);
  std::size_t unmap_interior(Block* b, std::size_t max_bytes);
  void map_run(Arena& a, std::size_t first, std::size_t count);
  void unmap_run(Arena& a, std::size_t first, std::size_t count);

  Context& ctx_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::vector<Block*> arena_first_;  // block at each arena's base; never merged away
  std::unordered_map<StreamId, StreamPool> streams_;
  SizeIndex shared_free_;
  IntrusiveList<Block, &Block::lru> warm_;  // LRU: front = freed longest ago
  std::size_t free_blocks_ = 0;
  std::size_t sweeps_pending_ = 0;
};

}  // namespace cuarena::detail
