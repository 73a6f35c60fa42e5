// cuarena::Allocator: the policy core's public C++ API.
//
// One Allocator serves one device through one DeviceBackend. Requests up to `small_limit` bytes
// come from size-class slabs; larger ones from a best-fit block pool over large virtual ranges
// whose physical memory is mapped granule by granule, so free address space costs no memory.
// See allocator/README.md for the design and the invariants each part keeps.
//
// Stream semantics (those of PyTorch's caching allocator and of cudaMallocAsync with
// ReuseFollowEventDependencies): a block freed on stream S may be handed out again at once on S;
// another stream gets it only after an event recorded on S after the free has completed. Blocks
// passed to record_stream() are not reused by anyone until events recorded at free time on each
// of those streams complete. No call blocks the host on the device except release_cached(), the
// last-resort synchronisation before an OutOfMemoryError and, under a loop plan (config
// loop_plan, the default), twice per plan: once a plan has served a whole period (the pool's
// cache it no longer needs is given back) and when a request takes the plan's idle memory.
//
// Stream lifetime: the allocator records events on a stream it has seen (one passed to
// allocate(), deallocate()'s block's stream, record_stream()) during later calls too, so its
// frees become reusable by other streams (memory first moves granules across streams this way).
// Such a stream must stay valid until the allocator is destroyed, or until release_cached() has
// returned with no block allocated on it; PyTorch never destroys its pool's streams, and the
// LD_PRELOAD shim parks the streams a program destroys.
//
// Thread semantics: every member function is safe to call concurrently (check_invariants() and
// live_blocks() then see a snapshot that calls in flight may make inconsistent). One mutex per
// Allocator (the device lock) guards the pool; when a free finds it held by another thread, the
// block is parked in its stream's cache (config stream_cache_bytes) and the next allocation of the
// same rounded size on that stream takes it back without the lock, so threads working on their own
// streams scale instead of queuing (not under loop_plan, whose planner must see every free). Parked
// blocks return to the pool at process_events(), release_cached() and before an out-of-memory
// error. Statistics count a parked block as freed; with threads contending, a peak_* value may
// under-read by at most the bytes parked (stream_cache_bytes per stream) because the fast path's
// changes are summed before they reach the statistics.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cuarena/config.hpp"
#include "cuarena/device_backend.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/stats.hpp"
#include "cuarena/types.hpp"

namespace cuarena {

class Allocator {
 public:
  /// `backend` must outlive the Allocator. Throws ConfigError when `config` is inconsistent
  /// with the backend (e.g. slab_size below the smallest class).
  explicit Allocator(DeviceBackend& backend, Config config = {});
  /// Unmaps every granule and releases the address space. Blocks still live are lost.
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  /// Returns a block of at least `bytes` bytes, 512-byte aligned, usable in stream order on
  /// `stream`. Returns nullptr for 0 bytes. Throws OutOfMemoryError (after releasing caches and
  /// waiting for outstanding events) when the device limit cannot accommodate it.
  void* allocate(std::size_t bytes, StreamId stream);

  /// As allocate(), with the block's address a multiple of `alignment` bytes (a power of two;
  /// at most kMinBlockSize is plain allocate()). For callers whose API promises an alignment,
  /// e.g. cuMemAddressReserve's, which the driver's VMM users set to the 2 MiB granularity.
  /// Served from the large pool (never a slab, a stream cache or a loop plan): the placement
  /// searches for `bytes` + `alignment` - 512 and splits the unaligned head off as a free block,
  /// so nothing is mapped for it. Throws std::invalid_argument for an alignment that is not a
  /// power of two, and OutOfMemoryError as allocate().
  void* allocate_aligned(std::size_t bytes, std::size_t alignment, StreamId stream);

  /// As allocate(), but the block carries no other stream's unfinished work: never another
  /// stream's free that the device has not reached, taken with a device wait (config
  /// internal_dependencies), nor a loop plan's block (whose stream waits for other streams'
  /// frees). Only `stream`'s own frees are reused before the device reaches them. For a caller
  /// that hands the block on to streams this allocator never sees (PyTorch's private pools,
  /// whose segments come from here on a stream of the adapter's own). Throws as allocate().
  void* allocate_isolated(std::size_t bytes, StreamId stream);

  /// As allocate(), but only a block already mapped: one the cache holds (a free block with every
  /// granule mapped, or a free slab slot), with no driver call. Returns nullptr where allocate()
  /// would map, create or reserve anything, and then nothing has changed: the same call to
  /// allocate() gets what it would have got without this one. `max_block`: a free block larger
  /// than this (and than the request) is not split for it either. Loop plans do not serve it.
  /// For callers holding frees back (the shim's held frees): they give those back when this
  /// fails, where the request may fit one of them better. Throws nothing but std::bad_alloc.
  /// `alignment` as allocate_aligned() (std::invalid_argument if not a power of two).
  void* allocate_cached(std::size_t bytes, StreamId stream, std::size_t max_block = SIZE_MAX,
                        std::size_t alignment = kMinBlockSize);

  /// Frees a block from allocate(). The block is reusable at once on its allocation stream, and
  /// on other streams after the events that guard it complete. nullptr is ignored. Throws
  /// InvalidPointerError for a pointer not currently allocated here. A block whose allocation
  /// stream is under graph capture is the caller's to free once the capture is over (as
  /// PyTorch defers such frees): its free may record an event on that stream.
  void deallocate(void* ptr);

  /// Marks `ptr` as used on `stream` too (PyTorch's Tensor.record_stream): when it is freed, it
  /// is not reused until an event recorded on `stream` at free time completes. Throws
  /// InvalidPointerError for a pointer not currently allocated here.
  void record_stream(void* ptr, StreamId stream);

  /// True when `ptr` lies in address space this allocator reserved (whether or not it is a
  /// live allocation): routes a free to the right device's allocator. O(arenas).
  bool owns(const void* ptr) const;

  /// Releases every cached granule whose guarding events have completed (PyTorch's
  /// empty_cache()), waiting for outstanding events first. Returns the bytes released.
  std::size_t release_cached();

  /// Polls outstanding events, finishes the frees they were guarding, and records an event on
  /// each stream whose frees are not yet covered by one, so they become reusable by every
  /// stream once it completes. Non-blocking; call it when convenient (e.g. once per step).
  void process_events();

  Stats stats() const;
  void reset_peak_stats();

  /// A change of the physical memory held: `bytes` > 0 when memory was created (a chunk, or a
  /// segment in segment mode), < 0 when released; `address` is where it was first mapped (the
  /// segment's base). The running sum of `bytes` is stats().reserved_bytes: what a memory
  /// snapshot reports as segment map / unmap events.
  struct ReservationChange {
    std::int64_t bytes;
    DevicePtr address;
  };
  /// Calls `observer` (empty: nobody) for every ReservationChange from now on, in the thread
  /// that caused it, holding the device lock: it must not call into this Allocator. Takes the
  /// device lock.
  void set_reservation_observer(std::function<void(const ReservationChange&)> observer);

  /// Calls `fn` holding the device lock, so it may use the backend (which is not thread-safe)
  /// while no allocation moves memory: for calls outside the policy, e.g. CUDA IPC export.
  void with_device_lock(const std::function<void()>& fn);

  /// Changes the fraction of the device this allocator may hold (PyTorch's
  /// set_per_process_memory_fraction), in (0, 1]. Memory already held above the new limit stays
  /// until freed and released. Throws ConfigError for a fraction outside (0, 1].
  void set_memory_fraction(double fraction);
  /// The most physical bytes this allocator may hold (capacity x fraction, granule-rounded).
  std::size_t memory_limit() const;
  const Config& config() const;

  /// A live allocation, for snapshots and tests.
  struct BlockInfo {
    DevicePtr ptr;
    std::size_t requested;  ///< bytes asked for
    std::size_t size;       ///< bytes reserved for it (rounded)
    StreamId stream;        ///< allocation stream
    bool small;             ///< served from a slab
  };
  std::vector<BlockInfo> live_blocks() const;

  /// The live allocation that starts at `ptr`, or nullopt. O(1); takes no device lock.
  std::optional<BlockInfo> find(const void* ptr) const;

  /// A run of reserved memory mapped at consecutive addresses (one segment in segment mode) and
  /// what lies in it, as PyTorch's memory snapshot reports segments and blocks. The pieces tile
  /// [addr, addr + size) in address order.
  struct SegmentInfo {
    enum class State {
      kAllocated,    ///< a live allocation ("active_allocated")
      kPendingFree,  ///< freed, waiting on record_stream events ("active_pending_free")
      kInactive,     ///< free memory, or a slab's free slots ("inactive")
    };
    struct Piece {
      DevicePtr addr;
      std::size_t size;       ///< bytes (rounded, for allocations)
      std::size_t requested;  ///< bytes asked for (0 when inactive)
      State state;
      StreamId stream;  ///< allocation stream (0 when inactive)
    };
    DevicePtr addr;
    std::size_t size;
    StreamId stream;  ///< the stream of the first allocation in it (0 when none)
    std::vector<Piece> blocks;
  };
  /// Every reserved run, in address order within each arena. O(live blocks + mapped granules):
  /// for snapshots, not hot paths. Blocks parked in stream caches count as inactive.
  std::vector<SegmentInfo> segments() const;

  /// Free memory inside reserved (mapped) memory, as BFC and RMM report it.
  struct Fragmentation {
    std::size_t free_bytes = 0;      ///< reserved bytes not backing a live allocation
    std::size_t largest_free = 0;    ///< largest contiguous mapped free range
    std::size_t rounding_waste = 0;  ///< allocated_bytes - requested_bytes
    /// 1 - largest_free / free_bytes (0 when nothing is free).
    double external() const {
      return free_bytes == 0 ? 0.0 : 1.0 - double(largest_free) / double(free_bytes);
    }
  };
  Fragmentation fragmentation() const;

  /// Where the reserved (physical) memory is, in bytes, each physical granule counted once
  /// (where it is mapped at two addresses, under the more used):
  /// in_use + owned_cached + shared_cached + retired + idle == reserved_bytes (mapping pools;
  /// segment mode the same, with retired and idle 0). slab_free and stream_cached are part of
  /// in_use.
  struct MemoryBreakdown {
    std::size_t in_use = 0;         ///< granules under allocated blocks and slabs
    std::size_t slab_free = 0;      ///< of in_use: free slots inside slabs
    std::size_t stream_cached = 0;  ///< of in_use: freed blocks parked in stream caches
    std::size_t owned_cached = 0;   ///< cached in free blocks only their stream may reuse yet
    std::size_t shared_cached = 0;  ///< cached in free blocks any stream may reuse or unmap
    /// under no allocated or free block, mapped only at a retired range (the old address of
    /// memory that moved): reusable once the freeing stream's event completes
    std::size_t retired = 0;
    std::size_t idle = 0;  ///< physical granules active nowhere (dormant at most)
  };
  /// O(mapped granules): for diagnostics, not for hot paths.
  MemoryBreakdown memory_breakdown() const;

  /// Verifies every internal invariant (block tiling, index membership, mapping, statistics);
  /// throws std::logic_error naming the first violation. O(blocks + granules): for tests. Call
  /// it while no other thread allocates or frees: the live table and the stream caches change
  /// outside the device lock, so a call in flight can look like a violation.
  void check_invariants() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuarena
