// CacheReturns: what comes back from the stream caches under the device lock: the statistics
// changes of the fast path, folded into Stats, and the blocks parked there, returned to their
// slab or the pool.
//
// Locks: every call is made under the allocator's device lock (the caches' own locks are taken
// inside StreamCache).
#pragma once

#include <cstddef>
#include <vector>

#include "cuarena/stats.hpp"
#include "front/stream_cache.hpp"
#include "large/block_pool.hpp"
#include "slabs/slab_set.hpp"

namespace cuarena::detail {

class CacheReturns {
 public:
  /// All four must outlive this.
  CacheReturns(StreamCaches& caches, Stats& stats, SlabSet& slabs, BlockPool& pool)
      : caches_(caches), stats_(stats), slabs_(slabs), pool_(pool) {}

  /// Returns every block parked in a stream cache to its slab or the pool (their statistics
  /// were counted at park time); true when there was any.
  bool drain_all();
  /// As drain_all(), for one stream's cache.
  void drain(StreamCache& c);
  /// Folds the statistics changes of the fast path into the statistics, and sets
  /// stream_cached_bytes to the bytes the caches hold.
  void fold();

 private:
  /// Applies deltas_ (fold order) and returns drained_ to the slabs and the pool, leaving both
  /// empty; true when any block was returned.
  bool return_drained();
  /// Every cache's decreases before any increase: a peak is never over-read.
  void apply_deltas();

  StreamCaches& caches_;
  Stats& stats_;
  SlabSet& slabs_;
  BlockPool& pool_;
  std::vector<CachedBlock> drained_;  // drain scratch; empty between calls
  std::vector<CacheDelta> deltas_;    // fold scratch; empty between calls
};

}  // namespace cuarena::detail
