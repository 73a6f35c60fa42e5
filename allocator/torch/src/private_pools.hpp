// PrivatePools: one device's PyTorch private memory pools (CUDA graph pools, torch.cuda.MemPool)
// and the open "allocate to pool" contexts that route allocations into them.
//
// Each pool is a cuarena::PrivatePool whose segments are allocations of the device's main
// cuarena allocator on a stream of the adapter's own (`segment_stream`), so the main allocator
// never hands a pool memory that some user stream freed and may still be using, and no event is
// ever recorded into a capture. PyTorch's reference counting is kept: createOrIncrefPool and
// beginAllocateToPool add a use, releasePool drops one; at zero the pool's free segments go back
// to the main allocator (after a device synchronisation: a released graph may still be replaying)
// and the pool is deleted once its last block is freed.
//
// Thread semantics: every member is safe to call concurrently (one mutex per device).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "private_pool.hpp"
#include "torch_compat.hpp"

namespace cuarena::torch_adapter {

struct PoolAllocation {
  void* ptr = nullptr;
  c10::MempoolId_t pool{0, 0};
};

class PrivatePools {
 public:
  /// `upstream` allocates and frees pool segments on the device's main allocator.
  explicit PrivatePools(PrivatePool::Upstream upstream) : upstream_(std::move(upstream)) {}

  // --- PyTorch's pool calls ------------------------------------------------------------------
  void create_or_incref(c10::MempoolId_t id);
  int use_count(c10::MempoolId_t id);
  void set_use_on_oom(c10::MempoolId_t id, bool use_on_oom);
  void set_no_split(c10::MempoolId_t id);
  /// Opens a context: allocations on streams `filter` accepts go to pool `id` (add a use).
  void begin(c10::MempoolId_t id, std::function<bool(cudaStream_t)> filter);
  void end(c10::MempoolId_t id);
  /// Drops a use. At zero, when `synchronized` (the caller synchronised the device, so no
  /// replay of a released graph still runs), the pool's free segments are given back now;
  /// otherwise at the next release_cached().
  void release(c10::MempoolId_t id, bool synchronized);

  /// True while any context is open (allocations may be routed, a capture may be underway).
  bool any_context() const { return contexts_.load(std::memory_order_acquire) != 0; }
  /// True while any pool exists (a free may belong to one).
  bool any_pool() const { return pools_alive_.load(std::memory_order_acquire) != 0; }

  /// Serves `bytes` on `stream` from the pool of the first open context that accepts `stream`;
  /// nullopt when none does. Throws cuarena::OutOfMemoryError when the pool cannot grow.
  std::optional<PoolAllocation> allocate(std::size_t bytes, cudaStream_t stream);
  /// Tries the pools marked use_on_oom; nullopt when none has room.
  std::optional<PoolAllocation> allocate_on_oom(std::size_t bytes, cudaStream_t stream);
  /// Frees `ptr` if a pool owns it (true), else false.
  bool deallocate(void* ptr, c10::MempoolId_t* pool = nullptr);
  /// The block size of a live pool allocation at `ptr`, or 0.
  std::size_t block_size(void* ptr);

  /// After a device synchronisation: every pool's free blocks become reusable by every stream,
  /// and freeable pools give their free segments back. `id` {0,0}: all pools; else that pool's
  /// free segments are released (emptyCache(pool)). Returns bytes given back.
  std::size_t release_cached(c10::MempoolId_t id);

  // --- Snapshots and CUDA-graph-tree checkpoints -------------------------------------------
  struct PoolSegments {
    c10::MempoolId_t id;
    std::vector<PrivatePool::SegmentView> segments;
  };
  std::vector<PoolSegments> segments(c10::MempoolId_t only = {0, 0});
  std::vector<PrivatePool::LiveBlock> live(c10::MempoolId_t id);
  /// Frees live blocks of pool `id` not in `keep` (returned), then makes every block of `keep`
  /// not live yet live again at its address (appended to `created`).
  std::vector<void*> restore(c10::MempoolId_t id, const std::vector<PrivatePool::LiveBlock>& keep,
                             std::vector<PrivatePool::LiveBlock>& created);
  bool live_equals(c10::MempoolId_t id, const std::unordered_set<void*>& expected);

  /// Bytes reserved by all pools, and their largest free block.
  std::size_t reserved_bytes();
  std::size_t largest_free_block();

  /// Bytes reserved by each pool that has reserved any since the last reset
  /// (DeviceStats::reserved_bytes_by_private_pools): current is 0 once a pool is deleted; peak,
  /// allocated and freed are kept until reset_reserved_peaks / reset_reserved_accumulated.
  std::vector<PoolReserved> reserved_stats();
  void reset_reserved_peaks();
  void reset_reserved_accumulated();  // also forgets deleted pools

 private:
  struct Entry {
    std::unique_ptr<PrivatePool> pool;
    int use_count = 0;
    bool use_on_oom = false;
    bool no_split = false;
  };
  struct Context {
    c10::MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
  };
  Entry& entry(c10::MempoolId_t id);  // throws c10::Error for an unknown pool
  /// upstream_, counting pool `id`'s segments in reserved_ (called under mu_).
  PrivatePool::Upstream counted_upstream(c10::MempoolId_t id);
  void erase_if_dead(std::map<c10::MempoolId_t, Entry>::iterator it);

  PrivatePool::Upstream upstream_;
  std::mutex mu_;
  std::map<c10::MempoolId_t, Entry> pools_;
  // by pool, segment bytes as PyTorch's Stat (current, peak, allocated, freed); under mu_
  std::map<c10::MempoolId_t, c10::CachingAllocator::Stat> reserved_;
  std::vector<Context> open_;
  std::atomic<int> contexts_{0};
  std::atomic<int> pools_alive_{0};
};

}  // namespace cuarena::torch_adapter
