// State shared by the parts of one Allocator: the backend, the statistics, and the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "cuarena/config.hpp"
#include "cuarena/device_backend.hpp"
#include "cuarena/stats.hpp"

namespace cuarena::detail {

/// Counts `n` allocations (or, negative, frees) of `bytes` rounded and `requested` asked-for
/// bytes, in `pool` and in all: allocation, active, allocated_bytes, active_bytes and
/// requested_bytes together, as an allocation and a free that waits on no event move them.
inline void count_allocations(Stats& stats, Pool pool, std::int64_t n, std::int64_t bytes,
                              std::int64_t requested) {
  for (int p : {int(Pool::kAll), int(pool)}) {
    for (auto [stat, amount] : {std::pair{&stats.allocation[p], n},
                                {&stats.active[p], n},
                                {&stats.allocated_bytes[p], bytes},
                                {&stats.active_bytes[p], bytes},
                                {&stats.requested_bytes[p], requested}}) {
      if (amount >= 0)
        stat->increase(amount);
      else
        stat->decrease(-amount);
    }
  }
}

struct Context {
  DeviceBackend& backend;
  const Config& config;
  Stats& stats;
  std::size_t granule;  ///< backend.granularity()
  std::size_t limit;    ///< most physical bytes that may be held at once
  std::size_t
      defrag_threshold_bytes;  ///< above this, reuse cached granules before creating new ones

  /// Told of every physical reservation made or released (Allocator::set_reservation_observer);
  /// empty when nobody asked. Called under the device lock.
  std::function<void(std::int64_t bytes, DevicePtr address)> on_reservation;
  void tell_reservation(std::int64_t bytes, DevicePtr address) const {
    if (on_reservation) on_reservation(bytes, address);
  }

  /// True while an allocation may take only a block already mapped (Allocator::allocate_cached):
  /// the pool then neither backs, maps, creates nor reserves anything.
  bool cached_only = false;
  std::size_t cached_max_block = SIZE_MAX;  ///< cached_only: the largest free block it may split
  /// Reserved bytes no fresh physical memory may take the pool past, for one attempt
  /// (GrowCeilingScope; config wait_before_grow): a request that would is refused, as past the
  /// limit, with nothing changed but caches.
  std::size_t grow_ceiling = SIZE_MAX;

  void add_reserved(Pool pool, std::int64_t bytes) {
    auto& r = stats.reserved_bytes;
    if (bytes >= 0) {
      r[int(Pool::kAll)].increase(bytes);
      r[int(pool)].increase(bytes);
    } else {
      r[int(Pool::kAll)].decrease(-bytes);
      r[int(pool)].decrease(-bytes);
    }
  }
  std::size_t reserved() const {
    return std::size_t(stats.reserved_bytes[int(Pool::kAll)].current);
  }
};

/// Context::cached_only for one allocation (under the device lock); false again when it ends,
/// also by an exception.
class CachedOnlyScope {
 public:
  CachedOnlyScope(Context& ctx, bool cached_only, std::size_t max_block) : ctx_(ctx) {
    ctx_.cached_only = cached_only;
    ctx_.cached_max_block = max_block;
  }
  ~CachedOnlyScope() {
    ctx_.cached_only = false;
    ctx_.cached_max_block = SIZE_MAX;
  }
  CachedOnlyScope(const CachedOnlyScope&) = delete;
  CachedOnlyScope& operator=(const CachedOnlyScope&) = delete;

 private:
  Context& ctx_;
};

/// Context::grow_ceiling for one attempt (under the device lock); no ceiling again when it ends,
/// also by an exception.
class GrowCeilingScope {
 public:
  GrowCeilingScope(Context& ctx, std::size_t ceiling) : ctx_(ctx) { ctx_.grow_ceiling = ceiling; }
  ~GrowCeilingScope() { ctx_.grow_ceiling = SIZE_MAX; }
  GrowCeilingScope(const GrowCeilingScope&) = delete;
  GrowCeilingScope& operator=(const GrowCeilingScope&) = delete;

 private:
  Context& ctx_;
};

}  // namespace cuarena::detail
