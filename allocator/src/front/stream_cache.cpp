#include "front/stream_cache.hpp"

#include "front/context.hpp"

namespace cuarena::detail {

void CacheDelta::apply_decreases(Stats& stats) const {
  for (std::size_t k = 0; k < 2; ++k) {
    if (parked[k] != 0)
      count_allocations(stats, k == 0 ? Pool::kSmall : Pool::kLarge, -parked[k], -parked_bytes[k],
                        -parked_requested[k]);
  }
}

void CacheDelta::apply_increases(Stats& stats) const {
  for (std::size_t k = 0; k < 2; ++k) {
    if (taken[k] != 0)
      count_allocations(stats, k == 0 ? Pool::kSmall : Pool::kLarge, taken[k], taken_bytes[k],
                        taken_requested[k]);
  }
  stats.stream_cache_hits += hits;
}

bool StreamCache::take(std::size_t size, bool small, std::size_t requested, CachedBlock& out) {
  std::lock_guard lock(mu_);
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    const CachedBlock& b = blocks_[i];
    if (b.size != size || b.small() != small) continue;
    out = b;
    blocks_.erase(blocks_.begin() + std::ptrdiff_t(i));
    count_.store(blocks_.size(), std::memory_order_relaxed);
    bytes_ -= size;
    const std::size_t k = small ? 0 : 1;
    ++delta_.taken[k];
    delta_.taken_bytes[k] += std::int64_t(size);
    delta_.taken_requested[k] += std::int64_t(requested);
    ++delta_.hits;
    return true;
  }
  return false;
}

bool StreamCache::park(const CachedBlock& b, std::size_t requested, std::size_t cap) {
  std::lock_guard lock(mu_);
  if (blocks_.size() >= kMaxBlocks || b.size > cap || bytes_ > cap - b.size) return false;
  blocks_.push_back(b);
  count_.store(blocks_.size(), std::memory_order_relaxed);
  bytes_ += b.size;
  const std::size_t k = b.small() ? 0 : 1;
  ++delta_.parked[k];
  delta_.parked_bytes[k] += std::int64_t(b.size);
  delta_.parked_requested[k] += std::int64_t(requested);
  return true;
}

void StreamCache::drain(std::vector<CachedBlock>& out, std::vector<CacheDelta>& deltas) {
  std::lock_guard lock(mu_);
  out.insert(out.end(), blocks_.begin(), blocks_.end());
  blocks_.clear();
  count_.store(0, std::memory_order_relaxed);
  parking_.store(false, std::memory_order_relaxed);
  bytes_ = 0;
  deltas.push_back(delta_);
  delta_ = CacheDelta{};
}

std::size_t StreamCache::take_delta(std::vector<CacheDelta>& deltas) {
  std::lock_guard lock(mu_);
  deltas.push_back(delta_);
  delta_ = CacheDelta{};
  return bytes_;
}

StreamCache* StreamCaches::find(StreamId stream) const {
  for (std::size_t i = 0, h = home(stream); i < kSlots; ++i) {
    StreamCache* c = slots_[(h + i) % kSlots].load(std::memory_order_acquire);
    if (c == nullptr) return nullptr;  // slots fill in probe order and are never emptied
    if (c->stream == stream) return c;
  }
  return nullptr;
}

StreamCache* StreamCaches::get(StreamId stream) {
  if (StreamCache* c = find(stream)) return c;
  std::lock_guard lock(create_mu_);
  for (std::size_t i = 0, h = home(stream); i < kSlots; ++i) {
    auto& slot = slots_[(h + i) % kSlots];
    StreamCache* c = slot.load(std::memory_order_acquire);
    if (c != nullptr && c->stream == stream) return c;  // another thread created it
    if (c == nullptr) {
      owned_.push_back(std::make_unique<StreamCache>(stream));
      slot.store(owned_.back().get(), std::memory_order_release);
      any_.store(true, std::memory_order_release);
      return owned_.back().get();
    }
  }
  return nullptr;
}

}  // namespace cuarena::detail
