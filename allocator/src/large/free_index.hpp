// FreeIndex: the large pool's blocks and the indexes that find its free ones.
//
// Every arena is tiled by Blocks in address order (prev/next). A block is
//   * allocated: handed out (BlockPool).
//   * owned free: freed on stream S, not yet known to be finished there; only S may reuse it.
//     In S's size index and S's free-order FIFO.
//   * shared free: any stream may reuse it (sharing.hpp says when a block becomes shared). In
//     the shared size index and, while it may hold mapped granules, in the LRU list warm().
//   * retired: granule-aligned part of an owned block whose physical granules back another
//     request of the same stream too (BlockPool::retire). In S's retired list only.
// Adjacent free blocks coalesce at once when in the same state (both shared, or both owned by
// one stream, neither waiting for owed sharing), and an owned block may absorb shared
// neighbours as its placement says (placement.hpp); never across arenas. The lower-address
// block object survives a merge, so an arena's first block never goes away.
//
// Size indexes are ordered sets keyed by (size, address): O(log n) best fit. The address index
// holds the free blocks a granule lookup may need (BlockPool::free_holder).
//
// Invariants (check_invariants(); the O(1) ones asserted at each mutation at
// CUARENA_DEBUG >= 2, the whole structure at coalesce() entry at CUARENA_DEBUG >= 3):
//   blocks tile each arena:  next->addr == addr + size,  sum of sizes over an arena == its size
//   b in shared()               <=>  free(b) && b->shared
//   b in stream(s).free, .fifo  <=>  free(b) && !b->shared && b->stream == s
//   b in stream(s).retired      <=>  b->retired && b->stream == s
//   b in free_by_addr_          <=>  addressable(b)  <=>  b->addressed
//   size()                      ==   |shared()| + sum over s of |stream(s).free|
//   stream(s).fifo, .retired    are sorted by free_seq
//   b in warm()                  =>  free(b) && (b->shared || unified())
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "large/stream_sweeps.hpp"
#include "physical/arena.hpp"
#include "support/assert.hpp"
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
  bool addressed = false;      ///< has its entry in FreeIndex's address index
  std::uint64_t free_seq = 0;  ///< owner stream's free sequence number at free/retire time
  Link<Block> fifo;            ///< owner's FIFO (owned free) or retired list
  Link<Block> lru;             ///< warm (free blocks that may hold granules to defragment)
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
using Fifo = IntrusiveList<Block, &Block::fifo>;
using Lru = IntrusiveList<Block, &Block::lru>;

/// A stream's free blocks; its sweep state (free numbers, events) is the base.
struct StreamFreeLists : StreamSweeps::Stream {
  explicit StreamFreeLists(NodeCache* nodes) : free(CachedAllocator<Block*>(nodes)) {}
  SizeIndex free;
  Fifo fifo;     // owned free blocks, sorted by free_seq
  Fifo retired;  // retired blocks, sorted by free_seq
  /// Sharing's (sharing.hpp): frees up to this number may be shared once the stream's unpolled
  /// entry is polled; 0: the stream has no unpolled entry.
  std::uint64_t unpolled_reach = 0;
};

class FreeIndex {
 public:
  /// `segments`: segment mode (shared blocks need no address entry, and absorb nothing).
  /// `unified`: owned free blocks are addressed too (unified placement).
  FreeIndex(bool segments, bool unified) : segments_(segments), unified_(unified) {}
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;

  /// Unified placement: owned free blocks may hold absorbed shared memory, so they are addressed
  /// (a granule lookup may land in them) and may be in warm().
  bool unified() const { return unified_; }
  /// Switches the placement mode. The caller re-addresses the owned blocks (index_address).
  void set_unified(bool unified) { unified_ = unified; }

  /// The stream's pool, made on first use. Consecutive calls are mostly for one stream: a
  /// one-entry cache skips the hash lookup then (entries are never erased, so it stays valid).
  StreamFreeLists& stream(StreamId stream) {
    if (last_sp_ == nullptr || stream != last_stream_) {
      last_sp_ = &streams_.try_emplace(stream, &size_nodes_).first->second;
      last_sp_->id = stream;
      last_stream_ = stream;
    }
    return *last_sp_;
  }
  const StreamFreeLists* find_stream(StreamId stream) const {
    const auto it = streams_.find(stream);
    return it == streams_.end() ? nullptr : &it->second;
  }
  /// The stream pool of b if b is an owned free or retired block, else nullptr.
  const StreamFreeLists* owner(const Block* b) const {
    if (b->allocated || b->shared) return nullptr;
    // A free's neighbours are mostly its own stream's: the cache skips the hash lookup.
    if (last_sp_ != nullptr && b->stream == last_stream_) return last_sp_;
    return find_stream(b->stream);
  }
  std::unordered_map<StreamId, StreamFreeLists>& streams() { return streams_; }
  const std::unordered_map<StreamId, StreamFreeLists>& streams() const { return streams_; }

  /// Block objects come from and go back to a node cache (a split or a merge on most calls).
  Block* new_block() { return new (block_nodes_.take(sizeof(Block))) Block; }
  void delete_block(Block* b) {
    b->~Block();
    block_nodes_.give(b, sizeof(Block));
  }
  /// The free block tiling all of arena `a` (shared), indexed, recorded as its first block.
  Block* tile(Arena& a);
  /// Each arena's first block, in the order tile() was called. The caller that gives an arena
  /// back deletes its blocks and erases its entry here.
  std::vector<Block*>& firsts() { return firsts_; }
  const std::vector<Block*>& firsts() const { return firsts_; }
  /// Splits b at `at` (strictly inside): b keeps [addr, at), the returned block, in b's state
  /// and unindexed, holds [at, end).
  Block* split_off(Block* b, DevicePtr at);

  /// Indexes a detached block by its state. Owned blocks go before `fifo_pos` in their stream's
  /// FIFO (at the back when null), retired ones at the back of its retired list; shared ones
  /// (and, unified, owned ones) join warm() when `warm`, before the current warm position.
  void insert(Block* b, Block* fifo_pos = nullptr, bool warm = true);
  /// insert() for a block put back with the free_seq it had (a placement that could not be
  /// backed): an owned one goes where its free_seq belongs in the FIFO, not at the back.
  /// O(FIFO length): for that failure path only.
  void reinsert(Block* b);
  /// Takes b out of its indexes. `keep_address`: b stays free at its address (it is re-inserted
  /// or absorbs its neighbours), so its address entry stays, saving a map erase and insert.
  void remove(Block* b, bool keep_address = false);
  /// Free blocks with an address entry: shared ones (but segments), owned ones placed unified.
  bool addressable(const Block* b) const {
    return !b->allocated && !b->retired && (b->shared ? !segments_ : unified_);
  }
  /// Gives b its address entry if addressable(b), else takes it away.
  void index_address(Block* b);

  /// Free blocks a and b may merge: both free, in one state, and (owned) of one stream with
  /// neither waiting for owed sharing (`owes`).
  template <class Owes>
  static bool mergeable(const Block* a, const Block* b, Owes&& owes) {
    if (!a->is_free() || !b->is_free() || a->shared != b->shared) return false;
    return a->shared || (a->stream == b->stream && !owes(a) && !owes(b));
  }
  /// Merges detached free block b with its neighbours and returns the survivor (detached).
  /// A neighbour n joins when mergeable (by `owes`) or, b being owned, n a free shared block
  /// that absorbs(b, n) allows; then the survivor keeps b's state and its stream's newest free
  /// number. `prepare(b, owned)` runs before each look and may change the pool (poll or settle
  /// owed sharing: it may insert, remove and coalesce other blocks, never b).
  template <class Owes, class Absorbs, class Prepare>
  Block* coalesce(Block* b, Owes&& owes, Absorbs&& absorbs, Prepare&& prepare);

  /// The shared free blocks by (size, address).
  const SizeIndex& shared() const { return shared_free_; }
  /// The addressed free block with the highest address <= `at`, or nullptr.
  const Block* addressed_at_or_below(DevicePtr at) const {
    auto it = free_by_addr_.upper_bound(at);
    return it == free_by_addr_.begin() ? nullptr : std::prev(it)->second;
  }
  /// LRU of free blocks that may hold granules to defragment: front = freed longest ago.
  Lru& warm() { return warm_; }
  const Lru& warm() const { return warm_; }
  /// Where insert() puts blocks in warm() (null: the back). Sharing sets it while settling.
  void set_warm_before(Block* at) { warm_before_ = at; }
  /// Free blocks, owned and shared (retired ones not counted).
  std::size_t size() const { return free_blocks_; }

  /// Throws std::logic_error naming the first broken invariant above, except those about
  /// `detached` (a free block between remove() and insert()). O(blocks log blocks).
  void check_invariants(const Block* detached = nullptr) const;

 private:
  /// Folds `upper` into its lower neighbour `lower` and deletes it.
  void absorb(Block* lower, Block* upper);
  void unaddress(Block* b) {
    if (!b->addressed) return;
    free_by_addr_.erase(b->addr);
    b->addressed = false;
  }

  const bool segments_;
  bool unified_;
  int coalescing_ = 0;  // coalesce() depth: only the outermost call checks the whole index
  // Before the indexes: their nodes go back to these when they are destroyed.
  NodeCache size_nodes_;     // SizeIndex nodes (shared_free_, every stream's free)
  NodeCache address_nodes_;  // free_by_addr_'s nodes
  NodeCache block_nodes_;    // Block objects
  std::unordered_map<StreamId, StreamFreeLists> streams_;
  StreamId last_stream_ = 0;  // stream()'s one-entry cache
  StreamFreeLists* last_sp_ = nullptr;
  SizeIndex shared_free_{CachedAllocator<Block*>(&size_nodes_)};
  AddressIndex free_by_addr_{CachedAllocator<std::pair<const DevicePtr, Block*>>(&address_nodes_)};
  Lru warm_;
  Block* warm_before_ = nullptr;
  std::size_t free_blocks_ = 0;
  std::vector<Block*> firsts_;  // block at each arena's base; never merged away
};

template <class Owes, class Absorbs, class Prepare>
Block* FreeIndex::coalesce(Block* b, Owes&& owes, Absorbs&& absorbs, Prepare&& prepare) {
  CUARENA_ASSERT_INTERNAL(b->is_free() && !b->fifo.linked && !b->lru.linked,
                          "coalesce: the block must be free and detached");
  // Nested calls (prepare() settling) meet the outer call's block detached: they skip the check.
  if (coalescing_ == 0) CUARENA_EXPENSIVE(check_invariants(b));
  struct Depth {  // restored on a throw from prepare() too
    int& n;
    explicit Depth(int& depth) : n(++depth) {}
    ~Depth() { --n; }
  } depth(coalescing_);
  const bool owned = !b->shared && !b->retired;
  const StreamId stream = b->stream;
  auto absorbable = [&](const Block* n) {
    return n != nullptr &&
           (mergeable(n, b, owes) || (owned && n->is_free() && n->shared && absorbs(b, n)));
  };
  bool crossed = false;  // merged across states: keep b's state and its stream's free order
  const bool shared = b->shared;
  for (;;) {
    prepare(b, owned);
    if (!absorbable(b->prev) && !absorbable(b->next)) break;
    if (absorbable(b->prev)) {
      Block* p = b->prev;
      crossed |= p->shared != shared;
      remove(p, /*keep_address=*/true);  // p stays free at its address
      unaddress(b);
      absorb(p, b);  // deletes b
      b = p;
    } else {
      Block* n = b->next;
      crossed |= n->shared != shared;
      remove(n);
      absorb(b, n);
    }
    if (crossed) {
      b->shared = shared;
      b->stream = stream;
    }
  }
  if (crossed) b->free_seq = this->stream(stream).seq;  // b was the stream's newest free
  return b;
}

}  // namespace cuarena::detail
