#include "private_pools.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

namespace cuarena::torch_adapter {

PrivatePools::Entry& PrivatePools::entry(c10::MempoolId_t id) {
  auto it = pools_.find(id);
  TORCH_CHECK(it != pools_.end(), "cuarena: no memory pool (", id.first, ", ", id.second,
              ") on this device");
  return it->second;
}

PrivatePool::Upstream PrivatePools::counted_upstream(c10::MempoolId_t id) {
  // PrivatePool calls its upstream only from members PrivatePools calls under mu_.
  return PrivatePool::Upstream{[this, id](std::size_t bytes) -> DevicePtr {
                                 const DevicePtr p = upstream_.allocate(bytes);
                                 if (p != 0) reserved_[id].increase(bytes);
                                 return p;
                               },
                               [this, id](DevicePtr ptr, std::size_t bytes) {
                                 upstream_.deallocate(ptr, bytes);
                                 reserved_[id].decrease(bytes);
                               }};
}

void PrivatePools::erase_if_dead(std::map<c10::MempoolId_t, Entry>::iterator it) {
  Entry& e = it->second;
  if (e.use_count > 0) return;
  e.pool->release_free_segments();
  if (e.pool->segment_count() == 0) {
    pools_.erase(it);
    pools_alive_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void PrivatePools::create_or_incref(c10::MempoolId_t id) {
  std::lock_guard lock(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end()) {
    Entry e;
    e.pool = std::make_unique<PrivatePool>(counted_upstream(id));
    it = pools_.emplace(id, std::move(e)).first;
    pools_alive_.fetch_add(1, std::memory_order_acq_rel);
  }
  ++it->second.use_count;
}

int PrivatePools::use_count(c10::MempoolId_t id) {
  std::lock_guard lock(mu_);
  auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second.use_count;
}

void PrivatePools::set_use_on_oom(c10::MempoolId_t id, bool use_on_oom) {
  std::lock_guard lock(mu_);
  entry(id).use_on_oom = use_on_oom;
}

void PrivatePools::set_no_split(c10::MempoolId_t id) {
  std::lock_guard lock(mu_);
  Entry& e = entry(id);
  if (e.no_split) return;
  TORCH_CHECK(e.pool->segment_count() == 0,
              "cuarena: setNoSplit on a memory pool that already holds memory");
  PrivatePool::Options o;
  o.no_split = true;
  e.pool = std::make_unique<PrivatePool>(counted_upstream(id), o);
  e.no_split = true;
}

void PrivatePools::begin(c10::MempoolId_t id, std::function<bool(cudaStream_t)> filter) {
  {
    std::lock_guard lock(mu_);
    for (const Context& c : open_) {
      TORCH_CHECK(c.id != id, "cuarena: beginAllocateToPool: already allocating to pool (",
                  id.first, ", ", id.second, ")");
    }
  }
  create_or_incref(id);
  std::lock_guard lock(mu_);
  open_.push_back({id, std::move(filter)});
  contexts_.store(int(open_.size()), std::memory_order_release);
}

void PrivatePools::end(c10::MempoolId_t id) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Context& c) { return c.id == id; });
  TORCH_CHECK(it != open_.end(), "cuarena: endAllocateToPool: pool (", id.first, ", ", id.second,
              ") has no open context");
  open_.erase(it);
  contexts_.store(int(open_.size()), std::memory_order_release);
}

void PrivatePools::release(c10::MempoolId_t id, bool synchronized) {
  std::lock_guard lock(mu_);
  auto it = pools_.find(id);
  TORCH_CHECK(it != pools_.end(), "cuarena: releasePool: no memory pool (", id.first, ", ",
              id.second, ")");
  TORCH_CHECK(it->second.use_count > 0, "cuarena: releasePool: pool already released");
  --it->second.use_count;
  if (synchronized) erase_if_dead(it);
}

std::optional<PoolAllocation> PrivatePools::allocate(std::size_t bytes, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  for (const Context& c : open_) {
    if (!c.filter(stream)) continue;
    Entry& e = entry(c.id);
    return PoolAllocation{e.pool->allocate(bytes, reinterpret_cast<StreamId>(stream)), c.id};
  }
  return std::nullopt;
}

std::optional<PoolAllocation> PrivatePools::allocate_on_oom(std::size_t bytes,
                                                            cudaStream_t stream) {
  std::lock_guard lock(mu_);
  for (auto& [id, e] : pools_) {
    if (!e.use_on_oom) continue;
    try {
      return PoolAllocation{e.pool->allocate(bytes, reinterpret_cast<StreamId>(stream)), id};
    } catch (const OutOfMemoryError&) {
      // try the next pool
    }
  }
  return std::nullopt;
}

bool PrivatePools::deallocate(void* ptr, c10::MempoolId_t* pool) {
  std::lock_guard lock(mu_);
  for (auto it = pools_.begin(); it != pools_.end(); ++it) {
    if (!it->second.pool->owns(ptr)) continue;
    it->second.pool->deallocate(ptr);
    if (pool != nullptr) *pool = it->first;
    if (it->second.use_count == 0 && it->second.pool->live_blocks() == 0) erase_if_dead(it);
    return true;
  }
  return false;
}

std::size_t PrivatePools::block_size(void* ptr) {
  std::lock_guard lock(mu_);
  for (auto& [id, e] : pools_) {
    if (e.pool->owns(ptr)) return e.pool->block_size(ptr);
  }
  return 0;
}

std::size_t PrivatePools::release_cached(c10::MempoolId_t id) {
  std::lock_guard lock(mu_);
  std::size_t bytes = 0;
  for (auto it = pools_.begin(); it != pools_.end();) {
    auto cur = it++;
    if (id != c10::MempoolId_t{0, 0} && cur->first != id) continue;
    PrivatePool& p = *cur->second.pool;
    p.share_free_blocks();
    const std::size_t before = p.reserved_bytes();
    if (cur->second.use_count == 0) {
      erase_if_dead(cur);
      bytes += before;  // erased or not, what it still holds is live
      continue;
    }
    if (id != c10::MempoolId_t{0, 0}) bytes += p.release_free_segments();
  }
  return bytes;
}

std::vector<PrivatePools::PoolSegments> PrivatePools::segments(c10::MempoolId_t only) {
  std::lock_guard lock(mu_);
  std::vector<PoolSegments> out;
  for (auto& [id, e] : pools_) {
    if (only != c10::MempoolId_t{0, 0} && id != only) continue;
    out.push_back({id, e.pool->segments()});
  }
  return out;
}

std::vector<PrivatePool::LiveBlock> PrivatePools::live(c10::MempoolId_t id) {
  std::lock_guard lock(mu_);
  return entry(id).pool->live();
}

std::vector<void*> PrivatePools::restore(c10::MempoolId_t id,
                                         const std::vector<PrivatePool::LiveBlock>& keep,
                                         std::vector<PrivatePool::LiveBlock>& created) {
  std::lock_guard lock(mu_);
  PrivatePool& p = *entry(id).pool;
  auto same = [](const PrivatePool::LiveBlock& a, const PrivatePool::LiveBlock& b) {
    return a.addr == b.addr && a.size == b.size;
  };
  std::vector<void*> freed;
  for (const PrivatePool::LiveBlock& b : p.live()) {
    if (std::none_of(keep.begin(), keep.end(), [&](const auto& k) { return same(k, b); })) {
      p.deallocate(reinterpret_cast<void*>(b.addr));
      freed.push_back(reinterpret_cast<void*>(b.addr));
    }
  }
  for (const PrivatePool::LiveBlock& k : keep) {
    if (p.is_live(reinterpret_cast<void*>(k.addr))) continue;
    p.allocate_at(k.addr, k.size, k.requested, k.stream);
    created.push_back(k);
  }
  return freed;
}

bool PrivatePools::live_equals(c10::MempoolId_t id, const std::unordered_set<void*>& expected) {
  std::lock_guard lock(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end()) return expected.empty();
  const auto live = it->second.pool->live();
  if (live.size() != expected.size()) return false;
  return std::all_of(live.begin(), live.end(), [&](const PrivatePool::LiveBlock& b) {
    return expected.count(reinterpret_cast<void*>(b.addr)) != 0;
  });
}

std::size_t PrivatePools::reserved_bytes() {
  std::lock_guard lock(mu_);
  std::size_t bytes = 0;
  for (auto& [id, e] : pools_) bytes += e.pool->reserved_bytes();
  return bytes;
}

std::vector<PoolReserved> PrivatePools::reserved_stats() {
  std::lock_guard lock(mu_);
  std::vector<PoolReserved> out;
  for (const auto& [id, stat] : reserved_) {
    PoolReserved r{id, {}};
    r.reserved[std::size_t(c10::CachingAllocator::StatType::AGGREGATE)] = stat;
    r.reserved[std::size_t(c10::CachingAllocator::StatType::LARGE_POOL)] = stat;  // no slabs
    out.push_back(r);
  }
  return out;
}

void PrivatePools::reset_reserved_peaks() {
  std::lock_guard lock(mu_);
  for (auto& [id, stat] : reserved_) stat.reset_peak();
}

void PrivatePools::reset_reserved_accumulated() {
  std::lock_guard lock(mu_);
  for (auto it = reserved_.begin(); it != reserved_.end();) {
    it->second.reset_accumulated();
    if (it->second.current == 0 && pools_.count(it->first) == 0) {
      it = reserved_.erase(it);
    } else {
      ++it;
    }
  }
}

std::size_t PrivatePools::largest_free_block() {
  std::lock_guard lock(mu_);
  std::size_t largest = 0;
  for (auto& [id, e] : pools_) largest = std::max(largest, e.pool->largest_free_block());
  return largest;
}

}  // namespace cuarena::torch_adapter
