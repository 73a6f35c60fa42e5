// cuarena::PrivatePool: a sub-allocator whose blocks go to no one outside it. It backs PyTorch's
// private memory pools (CUDA-graph pools, torch.cuda.MemPool) in the PyTorch adapter.
//
// The pool takes segments from an upstream (the main allocator, through two callbacks), splits
// them into blocks and hands blocks out; every size and address is in bytes, every block a
// multiple of 512 (kMinBlockSize) aligned to 512 (given 512-aligned segments).
//
// Segment sizes follow PyTorch's BlockPool rules (CUDACachingAllocator.cpp, get_allocation_size),
// for a request rounded up to 512 B:
//   * size <= small_limit (1 MiB):  one `granule` (2 MiB; PyTorch's kSmallBuffer)
//   * size <  medium_limit (10 MiB): `medium_segment` (20 MiB; PyTorch's kLargeBuffer)
//   * otherwise:                    round_up(size, granule)
// With no_split every segment is round_up(size, granule) and blocks are never split: a free block
// serves any request that fits it, whole (its whole size counts as allocated).
//
// Reuse is best fit over the free blocks the stream may use (smallest that fits, lowest address on
// ties), as RMM's coalescing_free_list, through sets ordered by (size, address): O(log n). The
// chosen block is split exactly: the remainder stays free with the same owner.
//
// Stream semantics: a block freed on stream S is *owned* by S: only S reuses it (stream order
// makes that safe). share_free_blocks() makes every free block *shared* (reusable by every
// stream); the adapter calls it once all streams are past the frees. Adjacent free blocks of one
// segment coalesce at once when they have the same owner (both shared, or both owned by one
// stream); never across segments.
//
// Thread semantics: not thread-safe. The caller (the adapter) serialises every call, const ones
// included, under its own lock.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "cuarena/errors.hpp"
#include "cuarena/types.hpp"

namespace cuarena {

/// PrivatePool::Options (at namespace scope so that `Options options = {}` compiles as a default
/// argument inside the class).
struct PrivatePoolOptions {
  bool no_split = false;          ///< torch.cuda.MemPool(no_split=True): one allocation per segment
  std::size_t granule = 2 << 20;  ///< segment sizes are multiples of this
  std::size_t small_limit = 1 << 20;      ///< requests up to this get a `granule`-sized segment
  std::size_t medium_limit = 10 << 20;    ///< requests below this get a `medium_segment` segment
  std::size_t medium_segment = 20 << 20;  ///< PyTorch's kLargeBuffer
};

class PrivatePool {
 public:
  struct Upstream {  // the main allocator, seen by the pool
    /// A segment of `bytes` bytes; 0 when out of memory. May throw cuarena::Error.
    std::function<DevicePtr(std::size_t bytes)> allocate;
    /// Gives back a segment, with the size allocate() was asked for.
    std::function<void(DevicePtr ptr, std::size_t bytes)> deallocate;
  };
  using Options = PrivatePoolOptions;

  /// Throws ConfigError unless granule and medium_segment are non-zero multiples of 512,
  /// small_limit <= granule and medium_limit <= medium_segment (so every request fits its segment).
  PrivatePool(Upstream upstream, Options options = {});
  /// Returns every segment upstream (live blocks are lost, as Allocator's destructor). Errors
  /// thrown by upstream.deallocate are swallowed.
  ~PrivatePool();
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;

  /// A block of at least `bytes` (rounded up to 512), usable on `stream`. Reuses the best-fitting
  /// free block owned by `stream` or shared, splitting it (unless no_split); else takes a new
  /// segment from upstream. Returns nullptr for 0 bytes. Throws OutOfMemoryError when upstream
  /// returns 0, and lets upstream's cuarena::Error through; the pool is then unchanged.
  void* allocate(std::size_t bytes, StreamId stream);
  /// Frees a block: it becomes free, owned by its allocation stream, and coalesces with its free
  /// neighbours of the same owner in its segment. nullptr is ignored. Throws InvalidPointerError
  /// for a pointer that is not the start of a live block here.
  void deallocate(void* ptr);
  /// Makes every free block reusable by every stream, and coalesces them. The caller must know
  /// that every stream is past the frees (e.g. after a device synchronisation). O(blocks).
  void share_free_blocks();
  /// Checkpoint restore (torch.compile's CUDA-graph trees): makes [ptr, ptr+bytes) a live block
  /// on `stream` with `requested` requested bytes; what is left of the free block around it stays
  /// free with its owner (so the range is carved exactly, even with no_split). Preconditions,
  /// throwing std::logic_error with the pool unchanged otherwise: ptr and bytes are non-zero
  /// multiples of 512, requested <= bytes, and the range lies wholly inside one free block.
  void allocate_at(DevicePtr ptr, std::size_t bytes, std::size_t requested, StreamId stream);
  /// Returns every segment without a live block upstream, whoever owns its free blocks. Returns
  /// the bytes returned.
  std::size_t release_free_segments();

  bool owns(const void* ptr) const;     ///< `ptr` lies inside one of this pool's segments
  bool is_live(const void* ptr) const;  ///< a live block starts at `ptr`
  /// The live block at `ptr`: its rounded size, or 0 when none starts there.
  std::size_t block_size(const void* ptr) const;

  // Statistics, in bytes or counts, with PyTorch's meanings. O(1) except largest_free_block
  // (O(streams)).
  std::size_t reserved_bytes() const { return reserved_; }    ///< sum of segment sizes
  std::size_t allocated_bytes() const { return allocated_; }  ///< sum of live blocks' sizes
  std::size_t requested_bytes() const { return requested_; }  ///< sum of live blocks' requests
  std::size_t live_blocks() const { return live_; }
  std::size_t segment_count() const { return segments_.size(); }
  std::size_t largest_free_block() const;

  /// For snapshots: every segment with the blocks tiling it, in address order.
  struct BlockView {
    DevicePtr addr;
    std::size_t size;
    std::size_t requested;  ///< 0 for a free block
    bool allocated;
  };
  struct SegmentView {
    DevicePtr addr;
    std::size_t size;
    StreamId stream;  ///< the stream whose request created the segment
    std::vector<BlockView> blocks;
  };
  std::vector<SegmentView> segments() const;
  /// Live blocks in address order, for checkpoints.
  struct LiveBlock {
    DevicePtr addr;
    std::size_t size;
    std::size_t requested;
    StreamId stream;
  };
  std::vector<LiveBlock> live() const;

  /// Verifies every invariant below; throws std::logic_error naming the first violation.
  /// O(blocks): for tests.
  void check_invariants() const;

 private:
  struct Block {
    std::size_t size = 0;
    std::size_t requested = 0;  ///< live blocks only
    DevicePtr segment = 0;      ///< base address of its segment
    StreamId stream = 0;        ///< live: allocation stream; owned free: owner
    bool allocated = false;
    bool shared = false;  ///< free and reusable by every stream
  };
  struct Segment {
    std::size_t size = 0;
    StreamId stream = 0;
    std::size_t live = 0;  ///< live blocks in it
  };
  using Blocks = std::map<DevicePtr, Block>;
  using FreeIndex = std::set<std::pair<std::size_t, DevicePtr>>;  ///< (size, address)

  static bool same_owner(const Block& a, const Block& b) {
    return a.shared == b.shared && (a.shared || a.stream == b.stream);
  }
  std::size_t segment_size(std::size_t size) const;
  FreeIndex& index_of(const Block& b) { return b.shared ? shared_ : owned_[b.stream]; }
  void index(Blocks::iterator it) { index_of(it->second).emplace(it->second.size, it->first); }
  void unindex(Blocks::iterator it) { index_of(it->second).erase({it->second.size, it->first}); }
  Blocks::iterator best_fit(std::size_t size, StreamId stream);
  Blocks::iterator new_segment(std::size_t requested, StreamId stream);
  Blocks::iterator split(Blocks::iterator it, std::size_t size);
  void occupy(Blocks::iterator it, std::size_t requested, StreamId stream);
  void coalesce_and_index(Blocks::iterator it);

  Upstream upstream_;
  Options options_;
  // segments_ do not overlap; for each, its blocks tile [base, base + size) in address order:
  //   Σ { b.size : b ∈ blocks_, b.segment = base } = segments_[base].size
  //   segments_[base].live = |{ b ∈ blocks_ : b.segment = base, b.allocated }|
  std::map<DevicePtr, Segment> segments_;
  // Every block, keyed by address. No two neighbours b, b' of one segment with
  //   ¬b.allocated ∧ ¬b'.allocated ∧ same_owner(b, b')   (coalescing is eager).
  Blocks blocks_;
  // shared_ = { (b.size, a) : blocks_[a] = b, ¬b.allocated, b.shared }
  // owned_[s] = { (b.size, a) : blocks_[a] = b, ¬b.allocated, ¬b.shared, b.stream = s }
  FreeIndex shared_;
  std::map<StreamId, FreeIndex> owned_;
  std::size_t reserved_ = 0;   // = Σ segments_[·].size
  std::size_t allocated_ = 0;  // = Σ { b.size : b allocated }
  std::size_t requested_ = 0;  // = Σ { b.requested : b allocated }
  std::size_t live_ = 0;       // = |{ b : b allocated }|
};

}  // namespace cuarena
