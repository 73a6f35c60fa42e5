// State shared by the parts of one Allocator: the backend, the statistics, and the limits.
#pragma once

#include <algorithm>
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

  /// False while an allocation may use only memory already held (Allocator::allocate_reserved):
  /// then ceiling() is reserved() and every creation of physical memory is refused.
  bool may_grow = true;

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
  /// Most physical bytes that may be held after the call in progress: the limit, or what is
  /// held already while growing is not allowed. Creations check this; heuristics that scale
  /// with the device (memory first's turn, the defrag threshold) keep using `limit`.
  std::size_t ceiling() const { return may_grow ? limit : std::min(limit, reserved()); }
};

/// Context::may_grow for one allocation (under the device lock); true again when it ends, also by
/// an exception.
class GrowthScope {
 public:
  GrowthScope(Context& ctx, bool may_grow) : ctx_(ctx) { ctx_.may_grow = may_grow; }
  ~GrowthScope() { ctx_.may_grow = true; }
  GrowthScope(const GrowthScope&) = delete;
  GrowthScope& operator=(const GrowthScope&) = delete;

 private:
  Context& ctx_;
};

}  // namespace cuarena::detail
