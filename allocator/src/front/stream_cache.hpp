// StreamCaches: per-stream caches of freed blocks in front of the device lock.
//
// Threads that each work on their own stream would otherwise queue on the Allocator's one mutex,
// as they do on PyTorch's one mutex per device. A free that finds the device lock held by another
// thread parks its block in its allocation stream's cache instead of waiting, and an allocation
// on a stream whose cache holds a block of exactly its rounded size takes it from there, without
// the device lock. Uncontended, nothing is ever cached, so a single-threaded program behaves and
// reserves exactly as without caches. (tcmalloc's per-thread caches, keyed by stream because
// stream order is what makes immediate reuse safe.)
//
// Stream order: a block freed on stream S may be handed out again at once on S, so only an
// allocation on S takes it; blocks with record_stream() uses never enter a cache.
//
// Invariants kept here: a cached block is still allocated in its slab or in the BlockPool, and
// its live record is gone; a cache holds at most `cap` bytes and kMaxBlocks blocks; the table of
// caches only grows, so a StreamCache* stays valid for the Allocator's life. Lock order: the
// device lock, then a cache's lock; the fast path holds a cache's lock alone.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuarena/stats.hpp"
#include "cuarena/types.hpp"
#include "support/spin_lock.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

struct Block;
struct Slab;

struct CachedBlock {
  DevicePtr ptr = 0;
  std::size_t size = 0;    ///< rounded bytes (class size, or the block's size)
  Slab* slab = nullptr;    ///< small: its slab
  Block* block = nullptr;  ///< large: its pool block
  bool small() const { return slab != nullptr; }
};

/// Statistics changes made on the fast path, folded into Stats under the device lock.
/// Index 0: small pool, 1: large pool.
struct CacheDelta {
  std::array<std::int64_t, 2> taken{}, taken_bytes{}, taken_requested{};
  std::array<std::int64_t, 2> parked{}, parked_bytes{}, parked_requested{};
  std::int64_t hits = 0;
  /// Applies the parks (decreases) to `stats`. A reader applies every cache's decreases before
  /// any increase, so a peak is never over-read (it may under-read: a peak reached and left
  /// between two folds is not seen).
  void apply_decreases(Stats& stats) const;
  /// Applies the takes (increases) and the hit count to `stats`.
  void apply_increases(Stats& stats) const;
};

class alignas(64) StreamCache {  // own cache lines: each is used by its stream's thread
 public:
  static constexpr std::size_t kMaxBlocks = tuning::kStreamCacheBlocks;

  explicit StreamCache(StreamId s) : stream(s) {}
  const StreamId stream;

  /// Takes a cached block of exactly `size` rounded bytes of the given kind (newest first).
  /// `requested` is what the new allocation asked for. False when there is none.
  bool take(std::size_t size, bool small, std::size_t requested, CachedBlock& out);
  /// Parks a freed block that asked for `requested` bytes; false, changing nothing, when it
  /// would pass `cap` bytes or kMaxBlocks blocks.
  bool park(const CachedBlock& b, std::size_t requested, std::size_t cap);
  /// Moves every cached block into `out` (to return them to the pool), the statistics changes
  /// into `deltas`, and stops parking. Caller holds the device lock.
  void drain(std::vector<CachedBlock>& out, std::vector<CacheDelta>& deltas);
  /// Moves the statistics changes into `deltas`; returns the bytes cached. Caller holds the
  /// device lock.
  std::size_t take_delta(std::vector<CacheDelta>& deltas);
  /// Calls fn(const CachedBlock&) on every cached block, under the cache's lock.
  template <class Fn>
  void for_each_block(Fn&& fn) {
    std::lock_guard lock(mu_);
    for (const CachedBlock& b : blocks_) fn(b);
  }
  /// While parking, every free on the stream is parked (room permitting) without trying the
  /// device lock: set when a free met the lock taken, cleared by drain(). Keeps the fast path
  /// steady under sustained contention; a single-threaded program never parks.
  bool parking() const { return parking_.load(std::memory_order_relaxed); }
  void start_parking() { parking_.store(true, std::memory_order_relaxed); }
  /// Cached blocks, read without the lock: a hint only.
  bool maybe_nonempty() const { return count_.load(std::memory_order_relaxed) != 0; }

 private:
  SpinLock mu_;                      // held for one short vector operation
  std::vector<CachedBlock> blocks_;  // newest last
  std::size_t bytes_ = 0;
  CacheDelta delta_;
  std::atomic<std::size_t> count_{0};
  std::atomic<bool> parking_{false};
};

/// The caches of one Allocator, by stream: lock-free lookup, creation under a mutex.
class StreamCaches {
 public:
  static constexpr std::size_t kSlots = tuning::kStreamCacheSlots;  ///< others go without

  /// The cache of `stream`, or nullptr when it has none. Lock-free.
  StreamCache* find(StreamId stream) const;
  /// The cache of `stream`, created if needed; nullptr when kSlots streams already have one.
  StreamCache* get(StreamId stream);
  /// True once any cache exists (then stays true).
  bool any() const { return any_.load(std::memory_order_acquire); }
  /// Calls fn(StreamCache&) on every cache.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const auto& slot : slots_) {
      if (StreamCache* c = slot.load(std::memory_order_acquire)) fn(*c);
    }
  }

 private:
  static std::size_t home(StreamId stream) {
    return std::size_t((stream * 0x9E3779B97F4A7C15ull) >> 56);  // top 8 bits: kSlots
  }
  static_assert(kSlots == 256, "home() takes the top 8 bits");

  std::array<std::atomic<StreamCache*>, kSlots> slots_{};  // open addressing, linear probing
  std::atomic<bool> any_{false};
  std::mutex create_mu_;
  std::vector<std::unique_ptr<StreamCache>> owned_;
};

}  // namespace cuarena::detail
