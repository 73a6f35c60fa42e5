#include "front/cache_returns.hpp"

namespace cuarena::detail {

bool CacheReturns::drain_all() {
  if (!caches_.any()) return false;
  caches_.for_each([&](StreamCache& c) { c.drain(drained_, deltas_); });
  return return_drained();
}

void CacheReturns::drain(StreamCache& c) {
  c.drain(drained_, deltas_);
  return_drained();
}

bool CacheReturns::return_drained() {
  apply_deltas();
  for (const CachedBlock& b : drained_) {
    if (b.slab)
      slabs_.deallocate(b.slab, b.ptr);
    else
      pool_.deallocate(b.block);
  }
  const bool any = !drained_.empty();
  drained_.clear();
  return any;  // stream_cached_bytes is refreshed by every reader's fold()
}

void CacheReturns::fold() {
  if (!caches_.any()) return;
  std::size_t bytes = 0;
  caches_.for_each([&](StreamCache& c) { bytes += c.take_delta(deltas_); });
  apply_deltas();
  stats_.stream_cached_bytes = std::int64_t(bytes);
}

void CacheReturns::apply_deltas() {
  for (const CacheDelta& d : deltas_) d.apply_decreases(stats_);
  for (const CacheDelta& d : deltas_) d.apply_increases(stats_);
  deltas_.clear();
}

}  // namespace cuarena::detail
