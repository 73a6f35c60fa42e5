#include "block_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace cuarena::detail {

namespace {
[[noreturn]] void broken(const std::string& what) {
  throw std::logic_error("cuarena invariant violated: " + what);
}
}  // namespace

BlockPool::~BlockPool() {
  for (auto& [stream, sp] : streams_) {
    if (sp.sweep_pending) ctx_.backend.release_event(sp.sweep_event);
  }
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    Arena& a = *arenas_[i];
    for (std::size_t g = 0, hw = a.high_water(); g < hw;) {
      if (!a.is_mapped(g)) {
        ++g;
        continue;
      }
      const std::size_t first = g;
      while (g < hw && a.is_mapped(g)) ++g;
      try {
        unmap_run(a, first, g - first);
      } catch (...) {  // a destructor must not throw; the device is going away anyway
      }
    }
    try {
      ctx_.backend.release_address(a.base(), a.size());
    } catch (...) {
    }
    for (Block* b = arena_first_[i]; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

BlockPool::StreamPool& BlockPool::stream_pool(StreamId stream) { return streams_[stream]; }

Block* BlockPool::best_fit(const SizeIndex& index, std::size_t size) const {
  auto it = index.lower_bound(size);
  return it == index.end() ? nullptr : *it;
}

Block* BlockPool::new_arena(std::size_t min_size) {
  const std::size_t g = ctx_.granule;
  std::size_t bytes = ctx_.config.va_reserve;
  if (bytes == 0) bytes = 4 * ctx_.backend.capacity();
  bytes = round_up(std::max(bytes, min_size), g);
  const DevicePtr base = ctx_.backend.reserve_address(bytes);
  arenas_.push_back(std::make_unique<Arena>(base, bytes, g));
  auto* b = new Block;
  b->addr = base;
  b->size = bytes;
  b->arena = arenas_.back().get();
  b->shared = true;
  arena_first_.push_back(b);
  ctx_.stats.segment[int(Pool::kAll)].increase(1);
  ctx_.stats.segment[int(Pool::kLarge)].increase(1);
  insert_free(b, nullptr, /*warm=*/false);
  return b;
}

void BlockPool::insert_free(Block* b, Block* fifo_pos, bool warm) {
  ++free_blocks_;
  if (b->shared) {
    shared_free_.insert(b);
    if (warm) warm_.push_back(b);
    return;
  }
  StreamPool& sp = stream_pool(b->stream);
  sp.free.insert(b);
  sp.fifo.insert_before(fifo_pos, b);
}

void BlockPool::remove_free(Block* b) {
  --free_blocks_;
  if (b->shared) {
    shared_free_.erase(b);
    if (warm_.contains(b)) warm_.erase(b);
    return;
  }
  StreamPool& sp = stream_pool(b->stream);
  sp.free.erase(b);
  sp.fifo.erase(b);
}

bool BlockPool::mergeable(const Block* a, const Block* b) {
  if (a->allocated || b->allocated) return false;
  if (a->shared != b->shared) return false;
  return a->shared || a->stream == b->stream;
}

Block* BlockPool::coalesce(Block* b) {
  // The lower-address block survives, so an arena's first block is never deleted.
  if (b->prev && mergeable(b->prev, b)) {
    Block* p = b->prev;
    remove_free(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    p->free_seq = std::max(p->free_seq, b->free_seq);
    p->used = p->used || b->used;
    delete b;
    b = p;
  }
  if (b->next && mergeable(b, b->next)) {
    Block* n = b->next;
    remove_free(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    b->free_seq = std::max(b->free_seq, n->free_seq);
    b->used = b->used || n->used;
    delete n;
  }
  return b;
}

Block* BlockPool::try_allocate(std::size_t size, StreamId stream) {
  StreamPool& sp = stream_pool(stream);
  Block* b = best_fit(sp.free, size);
  if (b == nullptr) {
    // Miss on the stream's own blocks: let finished streams' blocks become shared first.
    poll_sweeps();
    b = best_fit(shared_free_, size);
    if (b == nullptr) b = new_arena(size);
  }
  // Owned blocks are fully mapped; only a shared block can need granules.
  if (b->shared && !ensure_mapped(b, size)) return nullptr;

  const bool was_warm = warm_.contains(b);
  Block* fifo_pos = b->shared ? nullptr : IntrusiveList<Block, &Block::fifo>::next(b);
  remove_free(b);
  if (b->size > size) {
    auto* r = new Block;
    r->addr = b->addr + size;
    r->size = b->size - size;
    r->arena = b->arena;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    r->stream = b->stream;
    r->shared = b->shared;
    r->used = b->used;
    r->free_seq = b->free_seq;
    insert_free(r, fifo_pos, was_warm);
  }
  if (b->used && b->stream != stream) ++ctx_.stats.cross_stream_reuses;
  b->allocated = true;
  b->shared = false;
  b->used = true;
  b->stream = stream;
  return b;
}

void BlockPool::deallocate(Block* b) {
  StreamPool& sp = stream_pool(b->stream);
  b->allocated = false;
  b->shared = false;
  b->free_seq = ++sp.seq;
  b = coalesce(b);
  insert_free(b);  // newest free_seq: the FIFO's back keeps it sorted
}

bool BlockPool::ensure_mapped(Block* b, std::size_t size) {
  Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.covering(b->addr, size, first, last);
  const std::size_t need = a.count_unmapped(first, last) * ctx_.granule;
  if (need == 0) return true;

  // Keep b's own cached granules out of the steal pass.
  const bool was_warm = warm_.contains(b);
  if (was_warm) warm_.erase(b);
  std::size_t stolen = 0;
  if (ctx_.mapped_bytes() + need > ctx_.soft_limit) {
    // No poll here: turning blocks shared could coalesce `b` away under us.
    record_sweeps();  // so the next shortage finds more to reuse
    const std::size_t over = ctx_.mapped_bytes() + need - ctx_.soft_limit;
    stolen = steal(std::min(need, over));
  }
  if (ctx_.mapped_bytes() + need > ctx_.limit) {
    if (was_warm) warm_.push_back(b);
    return false;
  }
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // mapped by this call
  for (std::size_t g = first; g < last;) {
    if (a.is_mapped(g)) {
      ++g;
      continue;
    }
    const std::size_t run = g;
    while (g < last && !a.is_mapped(g)) ++g;
    if (!ctx_.backend.map(a.granule_addr(run), (g - run) * ctx_.granule)) {
      // The device refused: undo this call's mappings so nothing but caches changed.
      for (auto [start, count] : runs) unmap_run(a, start, count);
      if (was_warm) warm_.push_back(b);
      return false;
    }
    a.set_mapped(run, g - run, true);
    ++ctx_.stats.num_device_alloc;
    ctx_.stats.granules_mapped += std::int64_t(g - run);
    ctx_.add_reserved(Pool::kLarge, std::int64_t((g - run) * ctx_.granule));
    runs.emplace_back(run, g - run);
  }
  if (stolen > 0) ++ctx_.stats.stitched_ranges;
  if (was_warm) warm_.push_back(b);
  return true;
}

std::size_t BlockPool::steal(std::size_t bytes) {
  ++ctx_.stats.defrag_passes;
  std::size_t got = 0;
  for (Block* b = warm_.front(); b != nullptr && got < bytes;) {
    Block* next = IntrusiveList<Block, &Block::lru>::next(b);
    got += unmap_interior(b, bytes - got);
    b = next;
  }
  ctx_.stats.granules_stolen += std::int64_t(got / ctx_.granule);
  return got;
}

std::size_t BlockPool::unmap_interior(Block* b, std::size_t max_bytes) {
  Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.interior(b->addr, b->size, first, last);
  last = std::min(last, a.high_water());
  std::size_t released = 0;
  bool remaining = false;
  // Take from the top so the block's low end, which best fit reuses first, stays mapped.
  for (std::size_t g = last; g > first;) {
    if (!a.is_mapped(g - 1)) {
      --g;
      continue;
    }
    if (released >= max_bytes) {
      remaining = true;
      break;
    }
    const std::size_t end = g;
    const std::size_t budget = (max_bytes - released + ctx_.granule - 1) / ctx_.granule;
    while (g > first && a.is_mapped(g - 1) && end - g < budget) --g;
    unmap_run(a, g, end - g);
    released += (end - g) * ctx_.granule;
  }
  if (!remaining && warm_.contains(b)) warm_.erase(b);
  return released;
}

void BlockPool::unmap_run(Arena& a, std::size_t first, std::size_t count) {
  ctx_.backend.unmap(a.granule_addr(first), count * ctx_.granule);
  a.set_mapped(first, count, false);
  ++ctx_.stats.num_device_free;
  ctx_.stats.granules_unmapped += std::int64_t(count);
  ctx_.add_reserved(Pool::kLarge, -std::int64_t(count * ctx_.granule));
}

void BlockPool::record_sweeps() {
  for (auto& [stream, sp] : streams_) {
    if (sp.sweep_pending || sp.fifo.empty()) continue;
    sp.sweep_event = ctx_.backend.record_event(stream);
    sp.sweep_seq = sp.seq;
    sp.sweep_pending = true;
    ++sweeps_pending_;
    ++ctx_.stats.events_recorded;
  }
}

void BlockPool::poll_sweeps() {
  if (sweeps_pending_ == 0) return;
  for (auto& [stream, sp] : streams_) {
    if (!sp.sweep_pending || !ctx_.backend.event_completed(sp.sweep_event)) continue;
    ctx_.backend.release_event(sp.sweep_event);
    sp.sweep_pending = false;
    --sweeps_pending_;
    while (!sp.fifo.empty() && sp.fifo.front()->free_seq <= sp.sweep_seq) {
      make_shared(sp.fifo.front());
    }
  }
}

void BlockPool::make_shared(Block* b) {
  remove_free(b);
  b->shared = true;
  b = coalesce(b);
  insert_free(b);
}

void BlockPool::synchronize() {
  // Finish pending sweeps, cover everything freed since, and finish those too.
  for (int round = 0; round < 2; ++round) {
    for (auto& [stream, sp] : streams_) {
      if (sp.sweep_pending) ctx_.backend.wait_event(sp.sweep_event);
    }
    poll_sweeps();
    if (round == 0) record_sweeps();
  }
  ++ctx_.stats.num_sync_all_streams;
}

std::size_t BlockPool::release_cached() {
  std::size_t released = 0;
  while (!warm_.empty()) released += unmap_interior(warm_.front(), SIZE_MAX);
  return released;
}

void BlockPool::free_mapped_extents(std::size_t& total, std::size_t& largest) const {
  total = largest = 0;
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = *arenas_[i];
    const DevicePtr mapped_end = a.granule_addr(a.high_water());
    std::size_t run = 0;
    auto flush = [&] {
      largest = std::max(largest, run);
      run = 0;
    };
    for (const Block* b = arena_first_[i]; b != nullptr; b = b->next) {
      if (b->allocated) {
        flush();
        continue;
      }
      const DevicePtr end = std::min<DevicePtr>(b->addr + b->size, mapped_end);
      for (DevicePtr pos = b->addr; pos < end;) {
        const std::size_t g = a.granule_of(pos);
        const DevicePtr seg_end = std::min<DevicePtr>(end, a.granule_addr(g + 1));
        if (a.is_mapped(g)) {
          run += seg_end - pos;
          total += seg_end - pos;
        } else {
          flush();
        }
        pos = seg_end;
      }
      if (b->addr + b->size > mapped_end) flush();
    }
    flush();
  }
}

void BlockPool::check_invariants() const {
  std::size_t free_seen = 0, mapped_granules = 0;
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = *arenas_[i];
    DevicePtr expect = a.base();
    const Block* prev = nullptr;
    for (const Block* b = arena_first_[i]; b != nullptr; prev = b, b = b->next) {
      const std::string at = "block at " + std::to_string(b->addr);
      if (b->addr != expect) broken(at + ": blocks do not tile the arena");
      if (b->prev != prev || b->arena != &a) broken(at + ": neighbour links are wrong");
      if (b->size == 0 || b->size % kMinBlockSize != 0) broken(at + ": size not a 512 multiple");
      expect += b->size;
      std::size_t first = 0, last = 0;
      a.covering(b->addr, b->size, first, last);
      const bool fully_mapped = a.count_unmapped(first, last) == 0;
      if (b->allocated) {
        if (!fully_mapped) broken(at + ": allocated block not fully mapped");
        if (b->fifo.linked || b->lru.linked) broken(at + ": allocated block is indexed");
        continue;
      }
      ++free_seen;
      if (prev && mergeable(prev, b)) broken(at + ": mergeable free neighbours not coalesced");
      if (b->shared) {
        if (!shared_free_.count(const_cast<Block*>(b)) || b->fifo.linked)
          broken(at + ": shared block not in the shared index");
      } else {
        auto it = streams_.find(b->stream);
        if (it == streams_.end() || !it->second.free.count(const_cast<Block*>(b)) ||
            !b->fifo.linked || b->lru.linked)
          broken(at + ": owned block not in its stream's index");
        if (!fully_mapped) broken(at + ": owned free block not fully mapped");
      }
    }
    if (expect != a.base() + a.size()) broken("blocks do not cover the whole arena");
    mapped_granules += a.mapped_count();
  }
  std::size_t indexed = shared_free_.size();
  for (const auto& [stream, sp] : streams_) {
    indexed += sp.free.size();
    std::uint64_t last_seq = 0;
    for (const Block* b = sp.fifo.front(); b != nullptr;
         b = IntrusiveList<Block, &Block::fifo>::next(b)) {
      if (b->free_seq < last_seq) broken("stream FIFO not in free order");
      last_seq = b->free_seq;
    }
  }
  if (free_seen != free_blocks_ || indexed != free_blocks_) broken("free block count mismatch");
  if (mapped_granules * ctx_.granule != ctx_.mapped_bytes())
    broken("mapped granules disagree with reserved_bytes");
}

}  // namespace cuarena::detail
