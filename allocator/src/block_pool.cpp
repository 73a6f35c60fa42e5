#include "block_pool.hpp"

#include <algorithm>

#include "tuning.hpp"

namespace cuarena::detail {

namespace {
using Fifo = IntrusiveList<Block, &Block::fifo>;
using Lru = IntrusiveList<Block, &Block::lru>;
}  // namespace

BlockPool::~BlockPool() {
  for (auto& [stream, sp] : streams_) {
    for (auto& [event, seq] : sp.sweeps) ctx_.backend.release_event(event);
  }
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    Arena& a = *arenas_[i];
    if (a.segment()) {
      try {
        ctx_.backend.free_segment(a.base(), a.size());
      } catch (...) {  // a destructor must not throw; the device is going away anyway
      }
      for (Block* b = arena_first_[i]; b != nullptr;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
      continue;
    }
    for (std::size_t g = 0, hw = a.high_water(); g < hw;) {
      if (!a.has_mapping(g)) {
        ++g;
        continue;
      }
      const std::size_t n = mapping_extent(a.phys(g), g).count;  // g starts the mapping
      try {
        unmap_run(a, g, n);
      } catch (...) {  // a destructor must not throw; the device is going away anyway
      }
      g += n;
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
  // phys_ (a member) releases the chunks after this body.
}

Block* BlockPool::new_arena(std::size_t min_size, StreamId stream) {
  const std::size_t g = ctx_.granule;
  if (segments_) return new_segment(min_size, stream);
  std::size_t bytes = ctx_.config.va_reserve;
  if (bytes == 0) bytes = tuning::kVaReserveFactor * ctx_.backend.capacity();
  bytes = round_up(std::max(bytes, min_size), g);
  const DevicePtr base = ctx_.backend.reserve_address(bytes);
  arenas_.push_back(std::make_unique<Arena>(base, bytes, g));
  return add_arena_block();
}

Block* BlockPool::new_segment(std::size_t min_size, StreamId stream) {
  // PyTorch's segment sizes (CUDACachingAllocator.cpp: kSmallBuffer, kLargeBuffer): one granule
  // for requests up to 1 MiB (slabs), ten for requests under 10 MiB, so mid-size requests share
  // segments; larger requests get a segment of their own size. Near the limit, only the size.
  const std::size_t g = ctx_.granule;
  std::size_t bytes = min_size <= tuning::kSmallSegmentRequest ? g
                      : min_size < tuning::kMediumSegmentRequest
                          ? tuning::kMediumSegmentGranules * g
                          : 0;
  bytes = std::max(bytes, round_up(min_size, g));
  if (ctx_.reserved() + bytes > ctx_.limit) bytes = round_up(min_size, g);
  if (ctx_.reserved() + bytes > ctx_.limit) return nullptr;
  const DevicePtr base = ctx_.backend.allocate_segment(bytes, stream);
  if (base == 0) return nullptr;
  ++ctx_.stats.num_device_alloc;
  segment_bytes_ += bytes;
  ctx_.add_reserved(Pool::kLarge, std::int64_t(bytes));
  arenas_.push_back(std::make_unique<Arena>(base, bytes, g, /*segment=*/true));
  return add_arena_block();
}

Block* BlockPool::add_arena_block() {
  const Arena& a = *arenas_.back();
  auto* b = new Block;
  b->addr = a.base();
  b->size = a.size();
  b->arena = arenas_.back().get();
  b->shared = true;
  arena_first_.push_back(b);
  ctx_.stats.segment[int(Pool::kAll)].increase(1);
  ctx_.stats.segment[int(Pool::kLarge)].increase(1);
  insert_free(b, nullptr, /*warm=*/false);
  return b;
}

void BlockPool::insert_free(Block* b, Block* fifo_pos, bool warm) {
  if (b->shared) {
    ++free_blocks_;
    shared_free_.insert(b);
    if (!segments_) free_by_addr_.emplace(b->addr, b);
    if (warm && !b->arena->segment()) warm_.push_back(b);  // a segment is never unmapped
    return;
  }
  StreamPool& sp = stream_pool(b->stream);
  if (b->retired) {
    sp.retired.push_back(b);  // newest free_seq: keeps the list sorted
    return;
  }
  ++free_blocks_;
  sp.free.insert(b);
  sp.fifo.insert_before(fifo_pos, b);
  if (merged_) {
    free_by_addr_.emplace(b->addr, b);
    // It may hold finished granules (of a shared block it absorbed): steal() looks.
    if (warm) warm_.push_back(b);
  }
}

void BlockPool::remove_free(Block* b) {
  if (b->shared) {
    --free_blocks_;
    shared_free_.erase(b);
    if (!segments_) free_by_addr_.erase(b->addr);
    if (Lru::contains(b)) warm_.erase(b);
    return;
  }
  StreamPool& sp = stream_pool(b->stream);
  if (b->retired) {
    sp.retired.erase(b);
    return;
  }
  --free_blocks_;
  sp.free.erase(b);
  sp.fifo.erase(b);
  if (merged_) free_by_addr_.erase(b->addr);
  if (Lru::contains(b)) warm_.erase(b);
}

bool BlockPool::mergeable(const Block* a, const Block* b) {
  if (!a->is_free() || !b->is_free() || a->shared != b->shared) return false;
  return a->shared || a->stream == b->stream;
}

void BlockPool::absorb(Block* lower, Block* upper) {
  lower->size += upper->size;
  lower->next = upper->next;
  if (upper->next) upper->next->prev = lower;
  lower->free_seq = std::max(lower->free_seq, upper->free_seq);
  lower->used = lower->used || upper->used;
  lower->lazy = lower->lazy || upper->lazy;
  delete upper;
}

Block* BlockPool::coalesce(Block* b) {
  // An owned block also absorbs shared free neighbours (the merged block stays owned, and
  // becomes shared again at its stream's next sweep). Any stream may use shared memory, so this
  // is safe. With mapping, only neighbours this stream used last: its free space then stays in
  // one piece whenever its sweeps complete (the free ranges best fit sees do not depend on the
  // device's progress), while space it never used stays open to other streams.
  const bool owned = !b->shared && !b->retired;
  const StreamId stream = b->stream;
  auto absorbable = [&](const Block* n) {
    return n != nullptr &&
           (mergeable(n, b) || (owned && n->is_free() && n->shared &&
                                (segments_ || (merged_ && n->used && n->stream == stream))));
  };
  bool crossed = false;  // merged across states: keep b's state and its stream's free order
  const bool shared = b->shared;
  while (absorbable(b->prev) || absorbable(b->next)) {
    if (absorbable(b->prev)) {
      Block* p = b->prev;
      crossed |= p->shared != shared;
      remove_free(p);
      absorb(p, b);  // deletes b
      b = p;
    } else {
      Block* n = b->next;
      crossed |= n->shared != shared;
      remove_free(n);
      absorb(b, n);
    }
    if (crossed) {
      b->shared = shared;
      b->stream = stream;
    }
  }
  if (crossed) b->free_seq = stream_pool(stream).seq;  // b was the stream's newest free
  return b;
}

Block* BlockPool::split_off(Block* b, DevicePtr at) {
  auto* r = new Block;
  r->addr = at;
  r->size = b->end() - at;
  r->arena = b->arena;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = at - b->addr;
  r->stream = b->stream;
  r->shared = b->shared;
  r->retired = b->retired;
  r->used = b->used;
  r->lazy = b->lazy;
  r->free_seq = b->free_seq;
  return r;
}

Block* BlockPool::split_allocated(Block* b, DevicePtr at) {
  CUARENA_ASSERT(b->allocated && at > b->addr && at < b->end() && at % kMinBlockSize == 0,
                 "split_allocated: the cut must lie strictly inside an allocated block");
  Block* r = split_off(b, at);
  r->allocated = true;
  return r;
}

Block* BlockPool::try_allocate(std::size_t size, StreamId stream) {
  if (size > ctx_.limit) return nullptr;  // can never fit: do not even reserve address space
  StreamPool& sp = stream_pool(stream);
  // A miss on the stream's own blocks first lets finished streams' blocks become shared.
  if (sp.free.lower_bound(size) == sp.free.end()) poll_sweeps();
  Block* b = merged_ ? best_fit(sp, size) : own_then_shared(sp, size);
  if (b == nullptr) b = new_arena(size, stream);
  if (b == nullptr) return nullptr;  // a segment backend refused
  // Detach b (marked allocated) before anything can coalesce it away, and split off the
  // remainder first, so its cached granules can be stolen for this very request.
  const bool was_shared = b->shared;
  const bool was_warm = Lru::contains(b);
  Block* fifo_pos = was_shared ? nullptr : Fifo::next(b);
  remove_free(b);
  if (b->size > size) insert_free(split_off(b, b->addr + size), fifo_pos, was_shared || was_warm);
  b->allocated = true;
  // A shared block can lack granules; in memory-first mode an owned one can too (it may have
  // absorbed a shared neighbour); a lazy one can in both modes.
  if ((was_shared || merged_ || b->lazy) && !ensure_mapped(b, b->addr, size, stream)) {
    b->allocated = false;
    insert_free(coalesce(b));
    return nullptr;
  }
  b->lazy = false;
  if (b->used && b->stream != stream) ++ctx_.stats.cross_stream_reuses;
  b->shared = false;
  b->used = true;
  b->stream = stream;
  return b;
}

Block* BlockPool::own_then_shared(StreamPool& sp, std::size_t size) {
  auto own = sp.free.lower_bound(size);
  Block* b = own == sp.free.end() ? nullptr : *own;
  if (b != nullptr && b->size > size) {
    // A tighter shared block that needs no new memory beats a looser owned one, as one best fit
    // over both would choose (PyTorch's single best fit): splitting a looser block than needed
    // costs 8-12% more memory on the bundled training traces.
    auto it = shared_free_.lower_bound(size);
    if (it != shared_free_.end() && (*it)->size < b->size && missing_granules(*it, size, 1) == 0)
      b = *it;
  }
  if (b != nullptr) return b;
  // No own block fits, so best_fit() sees only the shared ones: among the few smallest, the one
  // missing fewest granules (best fit by size alone would often pick a block whose granules were
  // stolen over a slightly larger one still backed, and stealing for it moves memory every
  // iteration).
  return best_fit(sp, size);
}

Block* BlockPool::best_fit(StreamPool& sp, std::size_t size) {
  // The few smallest fits, by size over the stream's own blocks and the shared ones merged (its
  // own first on equal sizes), as one index would give them: the first that needs no driver call
  // wins, else the one missing fewest granules. A loop that found its mappings in place finds them
  // there again, and whether a block is still owned or already shared changes nothing (measured:
  // docs/results.md, 2026-12-02).
  const int candidates = tuning::kBackedFitCandidates;
  auto own = sp.free.lower_bound(size);
  auto shared = shared_free_.lower_bound(size);
  Block* best = nullptr;
  std::size_t best_missing = SIZE_MAX;
  for (int seen = 0; seen < candidates; ++seen) {
    const bool own_left = own != sp.free.end(), shared_left = shared != shared_free_.end();
    if (!own_left && !shared_left) break;
    Block* c = nullptr;
    // Equal sizes: the stream's own block first (it needs no event to be reused).
    if (own_left && (!shared_left || (*own)->size <= (*shared)->size))
      c = *own++;
    else
      c = *shared++;
    const std::size_t missing = missing_granules(c, size, best_missing);
    if (missing < best_missing) {
      best = c;
      best_missing = missing;
      if (missing == 0) break;
    }
  }
  return best;
}

std::size_t BlockPool::missing_granules(const Block* b, std::size_t size, std::size_t limit) const {
  if (segments_) return 0;
  const Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.covering(b->addr, size, first, last);
  std::size_t missing = 0;
  for (std::size_t g = first; g < last && missing < limit; ++g) {
    if (a.is_mapped(g)) continue;
    bool back = false;  // a dormant granule that comes back with no driver call
    if (a.is_dormant(g)) {
      const PhysRef p = a.phys(g);
      back = (phys_.whole(p.chunk) ? phys_.is_idle_whole(p.chunk) : phys_.is_idle(p)) ||
             active_holder(p) != nullptr;
    }
    missing += !back;
  }
  return missing;
}

void BlockPool::deallocate(Block* b) {
  const StreamId stream = b->stream;
  StreamPool& sp = stream_pool(stream);
  b->allocated = false;
  b->shared = false;
  b->free_seq = ++sp.seq;
  mark_unswept(sp);
  stamp(b);
  insert_free(coalesce(b));  // newest free_seq: the FIFO's back keeps it sorted
  // Keep one sweep in flight per stream, checked every sweep_interval frees, so blocks freed a
  // while ago are already shared when another stream or a shortage needs them.
  if (sp.seq % ctx_.config.sweep_interval != 0) return;
  poll_stream(sp);
  start_sweep(stream, sp);
}

const Block* BlockPool::free_holder(const Arena& a, std::size_t g) const {
  const DevicePtr at = a.granule_addr(g);
  auto it = free_by_addr_.upper_bound(at);
  if (it == free_by_addr_.begin()) return nullptr;
  const Block* b = std::prev(it)->second;
  if (b->arena != &a || b->end() < at + ctx_.granule) return nullptr;
  return b->shared || finished(a, g) ? b : nullptr;
}

const Block* BlockPool::active_holder(PhysRef p) const {
  const auto& active = phys_.active(p);
  if (active.size() != 1) return nullptr;
  const Arena& a = *active.front().arena;
  // A whole chunk moves only if one free block holds all of its active mapping.
  const Extent e = mapping_extent(p, active.front().granule);
  const Block* b = free_holder(a, e.first);
  for (std::size_t k = e.first + 1; k < e.first + e.count && b != nullptr; ++k)
    if (free_holder(a, k) != b) b = nullptr;
  return b;
}

Block* BlockPool::reserve_lazy(std::size_t size, StreamId stream) {
  if (segments_) return try_allocate(size, stream);
  if (size > ctx_.limit) return nullptr;
  // The range gets an arena of its own, so the pool's blocks stay where they would be: one an
  // earlier plan left wholly free with nothing mapped (not even dormant), else a new one. (A
  // plan is made again after every empty_cache(), and arenas are never given back.)
  Block* b = nullptr;
  for (std::size_t i = 0; i < arenas_.size() && b == nullptr; ++i) {
    Block* f = arena_first_[i];
    if (f->next != nullptr || !f->is_free() || !f->shared || f->size < size) continue;
    const Arena& a = *arenas_[i];
    bool empty = true;
    for (std::size_t k = 0; k < a.high_water() && empty; ++k) empty = !a.has_mapping(k);
    if (empty) b = f;
  }
  if (b == nullptr) b = new_arena(size, stream);
  const DevicePtr at = b->addr;
  remove_free(b);
  if (b->size > size) insert_free(split_off(b, at + size), nullptr, /*warm=*/false);
  b->allocated = true;
  b->lazy = true;
  b->shared = false;
  b->used = true;
  b->stream = stream;
  return b;
}

bool BlockPool::back_part(Block* b, DevicePtr addr, std::size_t size, StreamId stream) {
  CUARENA_ASSERT(
      b->allocated && (b->lazy || segments_) && addr >= b->addr && addr + size <= b->end(),
      "back_part: the part must lie inside a lazy allocated block");
  if (segments_) return true;  // backed whole
  return ensure_mapped(b, addr, size, stream);
}

bool BlockPool::backed(const Block* b, DevicePtr addr, std::size_t size) const {
  std::size_t first = 0, last = 0;
  b->arena->covering(addr, size, first, last);
  return b->arena->count_unmapped(first, last) == 0;
}

bool BlockPool::ensure_mapped(Block* b, DevicePtr addr, std::size_t size, StreamId stream) {
  Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.covering(addr, size, first, last);
  std::vector<std::size_t> holes;
  for (std::size_t g = first; g < last; ++g) {
    if (!a.is_mapped(g)) holes.push_back(g);
  }
  reactivate(b, a, holes);
  // Finished sweeps let more dormant granules come back with no driver call. b is detached,
  // so blocks shared here cannot coalesce it away.
  if (merged_ && !holes.empty()) poll_sweeps();
  reclaim_dormant(a, holes);
  reactivate(b, a, holes);
  std::size_t need = holes.size();
  if (need == 0) return true;
  // A hole granule that sticks out of b is shared with a free neighbour that other streams may
  // use at once, so it must not receive an alias of this stream's not-yet-finished memory.
  auto inside = [&](std::size_t g) {
    return a.granule_addr(g) >= addr && a.granule_addr(g + 1) <= addr + size;
  };

  const std::size_t gran = ctx_.granule;
  auto creates = [&](std::size_t have) { return (need - std::min(need, have)) * gran; };
  // Idle granules, counting whole chunks (an upper bound: a whole chunk backs only a hole run
  // at least its size).
  auto idle_now = [&] { return phys_.idle_granules() + phys_.idle_whole_granules(); };
  std::size_t reclaimed_idle = 0;
  std::vector<PhysRef> aliases;
  // Growing is allowed below the soft limit and below cache_slack over the peak of allocated
  // bytes; past both, cached granules are reused first.
  const auto slack_limit = static_cast<std::size_t>(
      (1.0 + ctx_.config.cache_slack) * double(ctx_.stats.allocated_bytes[int(Pool::kAll)].peak));
  const std::size_t soft = std::max(ctx_.soft_limit, ctx_.config.cache_slack > 0 ? slack_limit : 0);
  if (ctx_.reserved() + creates(idle_now()) > soft) {
    // Reuse before growing. b is detached, so sweeps finishing here cannot coalesce it away.
    // Poll before recording: a sweep recorded just now finishes at a time only the device
    // knows, and a decision taken on it would differ between the GPU and the simulator.
    poll_sweeps();
    record_sweeps();
    const std::size_t before = idle_now();
    steal(need);
    reclaimed_idle = idle_now() - std::min(before, idle_now());
    // Stealing may have freed the very granules some holes map dormant.
    reactivate(b, a, holes);
    need = holes.size();
    if (need == 0) return true;
  }
  // Idle whole chunks back the hole runs they fit; idle movable granules, aliases and fresh
  // granules fill the rest.
  std::vector<PhysRef> supply(need);
  std::vector<std::uint32_t> wholes;  // taken whole chunks, given back if the device refuses
  std::size_t packed = pack_whole(holes, supply, wholes);
  std::size_t aliased_whole = 0;
  const std::size_t idle = phys_.idle_granules();
  const std::size_t short_of = need - packed > idle ? need - packed - idle : 0;
  if (ctx_.config.stream_alias && short_of > 0 && ctx_.reserved() + short_of * gran > soft) {
    // Still short of memory: the stream's own free memory, mapped here too (aliases).
    std::vector<std::size_t> open;  // unfilled holes wholly inside b
    for (std::size_t i = 0; i < need; ++i) {
      if (!supply[i].valid() && inside(holes[i])) open.push_back(i);
    }
    if (!open.empty()) {
      StreamPool& sp = stream_pool(stream);
      aliased_whole = alias_whole(sp, holes, open, short_of, supply);
      packed += aliased_whole;
      const std::size_t left = need - packed > idle ? need - packed - idle : 0;
      std::size_t inner_open = 0;
      for (std::size_t i : open) inner_open += !supply[i].valid();
      const std::size_t want = std::min(left, inner_open);
      // Aliasing cannot be undone until the sweep: only start if it lets the request fit.
      if (want > 0 && ctx_.reserved() + creates(packed + idle + aliasable(sp, want)) <= ctx_.limit)
        alias(sp, want, aliases);
    }
  }
  const std::size_t rest = need - packed;
  const std::size_t have = std::min(rest, phys_.idle_granules() + aliases.size());
  const std::size_t fresh = rest - have;
  // Whole chunks that fit nowhere here are released before growing past the soft limit: their
  // bytes come back in the shape needed (a few calls instead of one per granule).
  while (fresh > 0 && ctx_.reserved() + fresh * gran > soft && !phys_.idle_whole_empty())
    release_idle_whole(phys_.idle_whole().rbegin()->second);
  auto give_back = [&](const std::vector<PhysRef>& taken) {
    for (const PhysRef& p : taken) phys_.put_idle(p);
    for (const std::uint32_t c : wholes) phys_.put_idle_whole(c);
  };
  if (ctx_.reserved() + fresh * gran > ctx_.limit) {
    give_back({});
    return false;
  }

  std::vector<PhysRef> taken;  // idle granules, given back if the device refuses
  while (aliases.size() + taken.size() < rest && phys_.idle_granules() > 0)
    taken.push_back(phys_.take_idle());
  // Aliases go only to holes wholly inside b; idle granules fill the rest, then fresh ones.
  std::vector<std::size_t> unfilled;
  std::size_t next_alias = 0, next_taken = 0;
  for (std::size_t i = 0; i < need; ++i) {
    if (supply[i].valid()) continue;
    if (next_alias < aliases.size() && inside(holes[i]))
      supply[i] = aliases[next_alias++];
    else if (next_taken < taken.size())
      supply[i] = taken[next_taken++];
    else
      unfilled.push_back(i);
  }
  if (!create_fresh(holes, unfilled, supply)) {
    give_back(taken);
    return false;  // the device refused; aliased granules return after their sweep
  }
  unmap_dormant(a, holes);
  map_granules(a, holes, supply);
  ctx_.stats.granules_aliased += std::int64_t(aliases.size() + aliased_whole);
  if (reclaimed_idle + aliases.size() + packed > 0 || have > aliases.size())
    ++ctx_.stats.stitched_ranges;
  return true;
}

std::size_t BlockPool::pack_whole(const std::vector<std::size_t>& holes,
                                  std::vector<PhysRef>& supply,
                                  std::vector<std::uint32_t>& wholes) {
  // Each run of consecutive holes takes the largest idle whole chunks that fit it, in order.
  std::size_t packed = 0;
  for (std::size_t i = 0; i < holes.size() && !phys_.idle_whole_empty();) {
    std::size_t j = i + 1;
    while (j < holes.size() && holes[j] == holes[j - 1] + 1) ++j;
    while (j - i >= 2) {
      const std::uint32_t c = phys_.largest_idle_whole(j - i);
      if (c == 0) break;
      phys_.take_whole(c);
      wholes.push_back(c);
      const std::size_t n = phys_.granules(c);
      for (std::size_t k = 0; k < n; ++k) supply[i + k] = {c, std::uint32_t(k)};
      i += n;
      packed += n;
    }
    i = j;
  }
  return packed;
}

void BlockPool::release_idle_whole(std::uint32_t chunk) {
  const PhysRef first{chunk, 0};
  while (!phys_.dormant(first).empty()) {
    const PhysicalPool::Mapping m = phys_.dormant(first).front();
    unmap_run(const_cast<Arena&>(*m.arena), m.granule, phys_.granules(chunk));
  }
  phys_.discard(chunk);
}

bool BlockPool::create_fresh(const std::vector<std::size_t>& holes,
                             const std::vector<std::size_t>& unfilled,
                             std::vector<PhysRef>& supply) {
  // Runs of consecutive hole granules long enough become whole chunks; the rest one chunk of
  // movable granules.
  // Near the limit, single granules: they can move wherever the next request needs them.
  const bool roomy = double(ctx_.reserved() + unfilled.size() * ctx_.granule) <=
                     ctx_.config.whole_chunk_fraction * double(ctx_.limit);
  const std::size_t min_run =
      ctx_.config.whole_chunk_min == 0 || !roomy
          ? SIZE_MAX
          : std::max(tuning::kMinWholeRunGranules, ctx_.config.whole_chunk_min / ctx_.granule);
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // [begin, end) into `unfilled`
  std::vector<std::size_t> singles;
  for (std::size_t i = 0; i < unfilled.size();) {
    std::size_t j = i + 1;
    while (j < unfilled.size() && holes[unfilled[j]] == holes[unfilled[j - 1]] + 1) ++j;
    if (j - i >= min_run)
      runs.emplace_back(i, j);
    else
      for (std::size_t k = i; k < j; ++k) singles.push_back(unfilled[k]);
    i = j;
  }
  std::vector<std::uint32_t> made;
  auto fail = [&] {
    for (std::uint32_t c : made) phys_.discard(c);
    return false;
  };
  // A run longer than whole_chunk_max, or than 1/16 of the memory already reserved (but at
  // least 32 MiB), becomes equal pieces: a chunk partly under a live block cannot move, so
  // smaller pieces strand less memory, and a small workload gets small chunks (sim
  // bert_varlen_infer: 1.35 -> 1.22).
  std::size_t cap = ctx_.config.whole_chunk_max == 0 ? SIZE_MAX : ctx_.config.whole_chunk_max;
  cap = std::min(
      cap, std::max(tuning::kWholeChunkMinCap, ctx_.reserved() / tuning::kWholeChunkReservedShare));
  const std::size_t max_run = cap == SIZE_MAX ? SIZE_MAX : std::max(min_run, cap / ctx_.granule);
  for (const auto& [run_begin, run_end] : runs) {
    const std::size_t len = run_end - run_begin, pieces = len / max_run + (len % max_run != 0);
    for (std::size_t piece = 0; piece < pieces; ++piece) {
      const std::size_t i = run_begin + len * piece / pieces;
      const std::size_t j = run_begin + len * (piece + 1) / pieces;
      const PhysRef c = phys_.create(j - i, /*whole=*/true);
      if (!c.valid()) return fail();
      made.push_back(c.chunk);
      for (std::size_t k = i; k < j; ++k) supply[unfilled[k]] = {c.chunk, std::uint32_t(k - i)};
    }
  }
  if (!singles.empty()) {
    const PhysRef c = phys_.create(singles.size());
    if (!c.valid()) return fail();
    for (std::size_t k = 0; k < singles.size(); ++k)
      supply[singles[k]] = {c.chunk, std::uint32_t(k)};
  }
  return true;
}

void BlockPool::map_granules(Arena& a, const std::vector<std::size_t>& granules,
                             const std::vector<PhysRef>& phys) {
  // One map call per run of consecutive virtual granules backed by consecutive granules of one
  // chunk, and one access grant over several runs: `granules` are the holes of one request's
  // range, so every granule between two of them is mapped already, by mappings lying wholly
  // between them. A grant's cost barely grows with its size (~40 us for 2 MiB, ~85 us for
  // 2 GiB on an H200), so runs far apart get their own.
  std::size_t span_begin = 0, span_end = 0;  // granules of the pending grant; empty if equal
  auto grant = [&] {
    if (span_end == span_begin) return;
    ctx_.backend.set_access(a.granule_addr(span_begin), (span_end - span_begin) * ctx_.granule);
    ++ctx_.stats.access_calls;
    span_begin = span_end = 0;
  };
  for (std::size_t i = 0; i < granules.size();) {
    std::size_t j = i + 1;
    while (j < granules.size() && granules[j] == granules[j - 1] + 1 &&
           phys[j].chunk == phys[i].chunk && phys[j].offset == phys[j - 1].offset + 1)
      ++j;
    const std::size_t count = j - i;
    if (span_end != span_begin && granules[i] - span_end > tuning::kMaxAccessGapGranules) grant();
    ctx_.backend.map_no_access(a.granule_addr(granules[i]), count * ctx_.granule,
                               phys_.handle(phys[i].chunk),
                               std::size_t(phys[i].offset) * ctx_.granule);
    for (std::size_t k = i; k < j; ++k) {
      a.set(granules[k], phys[k]);
      phys_.mapped(phys[k], {&a, granules[k]});
    }
    if (span_end == span_begin) span_begin = granules[i];
    span_end = granules[i] + count;
    ++ctx_.stats.map_calls;
    ctx_.stats.granules_mapped += std::int64_t(count);
    i = j;
  }
  grant();
}

void BlockPool::unmap_run(Arena& a, std::size_t first, std::size_t count) {
  ctx_.backend.unmap(a.granule_addr(first), count * ctx_.granule);
  for (std::size_t g = first; g < first + count; ++g) {
    if (a.is_dormant(g))
      phys_.remove_dormant(a.phys(g), {&a, g});
    else
      phys_.unmapped(a.phys(g), {&a, g});
    a.clear(g);
  }
  ++ctx_.stats.unmap_calls;
  ctx_.stats.granules_unmapped += std::int64_t(count);
}

BlockPool::Extent BlockPool::mapping_extent(PhysRef p, std::size_t g) const {
  if (!phys_.whole(p.chunk)) return {g, 1};
  return {g - p.offset, phys_.granules(p.chunk)};
}

void BlockPool::make_dormant(Arena& a, std::size_t g) {
  const unsigned cap = ctx_.config.dormant_maps;
  // A whole chunk's mapping changes state as one piece.
  const auto [start, n] = mapping_extent(a.phys(g), g);
  if (cap == 0) {
    unmap_run(a, start, n);
    return;
  }
  for (std::size_t k = start; k < start + n; ++k) {
    const PhysRef q = a.phys(k);
    a.set_dormant(k, true);
    phys_.unmapped(q, {&a, k});
    phys_.add_dormant(q, {&a, k});
  }
  const PhysRef head = a.phys(start);
  if (phys_.dormant(head).size() > cap) {
    const PhysicalPool::Mapping oldest = phys_.dormant(head).front();
    unmap_run(const_cast<Arena&>(*oldest.arena), oldest.granule, n);
  }
}

void BlockPool::reactivate(Block* b, Arena& a, std::vector<std::size_t>& holes) {
  std::size_t n = 0;
  bool spilled = false;  // a whole chunk came back active past the holes, in a free neighbour
  for (const std::size_t g : holes) {
    if (!a.is_dormant(g)) continue;
    const PhysRef p = a.phys(g);
    const bool whole = phys_.whole(p.chunk);
    if (whole ? !phys_.is_idle_whole(p.chunk) : !phys_.is_idle(p)) continue;
    if (whole)
      phys_.take_whole(p.chunk);
    else
      phys_.take(p);
    const auto [start, count] = mapping_extent(p, g);  // a whole chunk comes back whole
    for (std::size_t k = start; k < start + count; ++k) {
      const PhysRef q = a.phys(k);
      phys_.remove_dormant(q, {&a, k});
      phys_.mapped(q, {&a, k});
      a.set_dormant(k, false);
    }
    n += count;
    spilled |= start < holes.front() || start + count > holes.back() + 1;
  }
  if (n == 0) return;
  holes.erase(
      std::remove_if(holes.begin(), holes.end(), [&](std::size_t g) { return a.is_mapped(g); }),
      holes.end());
  ctx_.stats.granules_reactivated += std::int64_t(n);
  // Active granules in a shared free block must be findable by steal().
  if (spilled) {
    for (Block* nb : {b->prev, b->next}) {
      if (nb != nullptr && nb->is_free() && nb->shared && !Lru::contains(nb)) warm_.push_back(nb);
    }
  }
}

void BlockPool::reclaim_dormant(const Arena& a, const std::vector<std::size_t>& holes) {
  for (const std::size_t h : holes) {
    if (!a.is_dormant(h)) continue;
    const PhysRef p = a.phys(h);
    const Block* holder = active_holder(p);
    if (holder == nullptr) continue;
    const PhysicalPool::Mapping m = phys_.active(p).front();
    make_dormant(*holder->arena, m.granule);
    ctx_.stats.granules_stolen += std::int64_t(mapping_extent(p, h).count);
  }
}

void BlockPool::unmap_dormant(Arena& a, const std::vector<std::size_t>& holes) {
  // One call per run of dormant movable granules; a whole chunk's mapping goes whole, even
  // where it reaches past the holes into the free block above.
  for (std::size_t i = 0; i < holes.size();) {
    const std::size_t g = holes[i];
    if (!a.is_dormant(g)) {
      ++i;
      continue;
    }
    if (phys_.whole(a.phys(g).chunk)) {
      const Extent e = mapping_extent(a.phys(g), g);
      unmap_run(a, e.first, e.count);
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < holes.size() && holes[j] == holes[j - 1] + 1 && a.is_dormant(holes[j]) &&
           !phys_.whole(a.phys(holes[j]).chunk))
      ++j;
    unmap_run(a, g, j - i);
    i = j;
  }
}

void BlockPool::steal(std::size_t target) {
  ++ctx_.stats.defrag_passes;
  // Single granules first; whole chunks (which become idle whole chunks, and may fit no run of
  // the request's holes) only if that is not enough.
  auto idle = [&] { return phys_.idle_granules() + phys_.idle_whole_granules(); };
  const std::size_t before = idle();
  auto short_by = [&] { return idle() < target ? target - idle() : 0; };
  for (Take take : {Take::kMovable, Take::kWholeToo}) {
    for (Block* b = warm_.front(); b != nullptr && short_by() > 0;) {
      Block* next = Lru::next(b);
      unmap_interior(b, short_by(), take);
      b = next;
    }
    if (short_by() == 0) break;
  }
  ctx_.stats.granules_stolen += std::int64_t(idle() - std::min(before, idle()));
}

void BlockPool::unmap_interior(Block* b, std::size_t max_granules, Take take) {
  Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.interior(b->addr, b->size, first, last);
  last = std::min(last, a.high_water());
  std::size_t got = 0;  // movable granules unmapped plus whole-chunk granules released
  bool remaining = false;
  const bool limited = take != Take::kAll;
  // An owned block (one that absorbed a shared neighbour) gives only finished granules.
  auto ready = [&](std::size_t g) { return b->shared || finished(a, g); };
  auto movable = [&](std::size_t g) {
    return a.is_mapped(g) && !phys_.whole(a.phys(g).chunk) && ready(g);
  };
  // Take from the top so the low end, which best fit reuses first, stays mapped.
  for (std::size_t g = last; g > first;) {
    if (!a.is_mapped(g - 1) || !ready(g - 1)) {
      --g;
      continue;
    }
    const PhysRef top = a.phys(g - 1);
    if (phys_.whole(top.chunk)) {
      // A whole chunk goes all at once, and only if the block holds all of it.
      const auto [start, n] = mapping_extent(top, g - 1);
      bool all_ready = true;
      for (std::size_t k = start; k < start + n && all_ready; ++k) all_ready = ready(k);
      if (start >= first && start + n <= last && all_ready) {
        if (take == Take::kMovable || (limited && got >= max_granules)) {
          remaining = true;
        } else {
          if (take == Take::kAll)
            unmap_run(a, start, n);
          else
            make_dormant(a, start);  // idle as one piece, for a run it fits
          got += n;
        }
      }
      g = start > first ? start : first;
      continue;
    }
    if (limited && got >= max_granules) {
      remaining = true;
      break;
    }
    const std::size_t end = g;
    while (g > first && movable(g - 1) && (!limited || end - g < max_granules - got)) --g;
    if (take == Take::kAll || ctx_.config.dormant_maps == 0)
      unmap_run(a, g, end - g);
    else
      for (std::size_t k = g; k < end; ++k) make_dormant(a, k);
    got += end - g;
  }
  if (!remaining && Lru::contains(b)) warm_.erase(b);
}

std::size_t BlockPool::alias_whole(StreamPool& sp, const std::vector<std::size_t>& holes,
                                   const std::vector<std::size_t>& open, std::size_t want,
                                   std::vector<PhysRef>& supply) {
  // Runs of open holes: [begin, end) into `open`, consecutive granules.
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t i = 0; i < open.size();) {
    std::size_t j = i + 1;
    while (j < open.size() && holes[open[j]] == holes[open[j - 1]] + 1) ++j;
    if (j - i >= 2) runs.emplace_back(i, j);
    i = j;
  }
  if (runs.empty()) return 0;
  struct Pick {
    Block* block;
    std::size_t granule;  // the chunk's first virtual granule in block
  };
  std::vector<Pick> picks;
  std::size_t got = 0;
  // Oldest freed first; each whole chunk wholly inside an owned block goes to the tightest run
  // it fits.
  for (Block* f = sp.fifo.front(); f != nullptr && got < want; f = Fifo::next(f)) {
    const Arena& a = *f->arena;
    std::size_t first = 0, last = 0;
    a.interior(f->addr, f->size, first, last);
    for (std::size_t g = first; g < last && got < want;) {
      if (!a.is_mapped(g)) {  // a hole of a shared block this one absorbed
        ++g;
        continue;
      }
      const PhysRef p = a.phys(g);
      const auto [start, n] = mapping_extent(p, g);
      if (n == 1 || start != g || g + n > last) {  // a single granule, or a chunk not wholly inside
        g = start + n;
        continue;
      }
      auto best = runs.end();
      for (auto r = runs.begin(); r != runs.end(); ++r) {
        if (r->second - r->first >= n &&
            (best == runs.end() || r->second - r->first < best->second - best->first))
          best = r;
      }
      if (best != runs.end()) {
        for (std::size_t k = 0; k < n; ++k)
          supply[open[best->first + k]] = {p.chunk, std::uint32_t(k)};
        best->first += n;
        got += n;
        picks.push_back({f, g});
      }
      g += n;
    }
  }
  // Retire each picked range: [f, g0) stays owned, [g0, g0+n) retired, the rest owned. Picks
  // in one block are retired from the top down, so the lower part keeps the block object.
  for (auto it = picks.rbegin(); it != picks.rend(); ++it) {
    const Arena& a = *it->block->arena;
    retire(sp, it->block, it->granule, it->granule + phys_.granules(a.phys(it->granule).chunk));
  }
  return got;
}

void BlockPool::retire(StreamPool& sp, Block* f, std::size_t g0, std::size_t g1) {
  const Arena& a = *f->arena;
  Block* next = Fifo::next(f);  // the pieces keep f's place in the free order
  remove_free(f);
  Block* mid = f;
  if (a.granule_addr(g0) > f->addr) {
    mid = split_off(f, a.granule_addr(g0));
    insert_free(f, next);
  }
  if (a.granule_addr(g1) < mid->end()) insert_free(split_off(mid, a.granule_addr(g1)), next);
  mid->retired = true;
  mid->lazy = false;  // its granules are mapped: that is what it lends
  mid->free_seq = ++sp.seq;
  mark_unswept(sp);
  stamp(mid);
  insert_free(mid);  // back of the retired list: waits for a sweep recorded from now on
}

std::size_t BlockPool::aliasable(const StreamPool& sp, std::size_t max) const {
  std::size_t n = 0;
  for (const Block* f = sp.fifo.front(); f != nullptr && n < max; f = Fifo::next(f)) {
    std::size_t first = 0, last = 0;
    f->arena->interior(f->addr, f->size, first, last);
    for (std::size_t g = first; g < last && n < max; ++g)
      n += f->arena->is_mapped(g) && !phys_.whole(f->arena->phys(g).chunk);
  }
  return std::min(n, max);
}

std::size_t BlockPool::alias(StreamPool& sp, std::size_t want, std::vector<PhysRef>& out) {
  std::size_t got = 0;
  for (Block* f = sp.fifo.front(); f != nullptr && got < want;) {
    Block* next = Fifo::next(f);
    Arena& a = *f->arena;
    std::size_t first = 0, last = 0;
    a.interior(f->addr, f->size, first, last);
    // The topmost run of actively mapped single granules (whole chunks go through
    // alias_whole), at most what is wanted.
    auto single = [&](std::size_t g) { return a.is_mapped(g) && !phys_.whole(a.phys(g).chunk); };
    while (last > first && !single(last - 1)) --last;
    std::size_t g0 = last;
    while (g0 > first && last - g0 < want - got && single(g0 - 1)) --g0;
    if (last > g0) {
      for (std::size_t g = g0; g < last; ++g) out.push_back(a.phys(g));
      got += last - g0;
      retire(sp, f, g0, last);
    }
    f = next;
  }
  return got;
}

void BlockPool::start_sweep(StreamId stream, StreamPool& sp) {
  if (sp.fifo.empty() && sp.retired.empty()) return;
  if (!sp.sweeps.empty() && sp.sweeps.back().second == sp.seq) return;  // nothing new to cover
  if (sp.sweeps.size() >= tuning::kMaxSweepsPerStream) {
    // Full: the newest sweep is superseded by one that also covers the latest frees (the
    // older ones in flight still complete first).
    ctx_.backend.release_event(sp.sweeps.back().first);
    sp.sweeps.pop_back();
    --sweeps_pending_;
  }
  sp.sweeps.emplace_back(ctx_.backend.record_event(stream), sp.seq);
  if (!sp.sweeping) {
    sp.sweeping = true;
    sweeping_.push_back(&sp);
  }
  ++sweeps_pending_;
  ++ctx_.stats.events_recorded;
}

void BlockPool::poll_stream(StreamPool& sp) {
  while (!sp.sweeps.empty() && ctx_.backend.event_completed(sp.sweeps.front().first)) {
    const auto [event, covered] = sp.sweeps.front();
    sp.sweeps.pop_front();
    ctx_.backend.release_event(event);
    --sweeps_pending_;
    sp.done = covered;
    while (!sp.fifo.empty() && sp.fifo.front()->free_seq <= covered) make_shared(sp.fifo.front());
    while (!sp.retired.empty() && sp.retired.front()->free_seq <= covered)
      make_shared(sp.retired.front());
  }
}

void BlockPool::record_sweeps() {
  std::vector<StreamPool*> listed;
  listed.swap(unswept_);
  for (StreamPool* sp : listed) {
    sp->unswept = false;
    start_sweep(sp->id, *sp);  // covers everything it freed, or has nothing new to cover
  }
}

void BlockPool::poll_sweeps() {
  if (sweeps_pending_ == 0) return;
  // Index loop: sharing blocks never records a sweep, but keep no iterator across it anyway.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < sweeping_.size(); ++i) {
    StreamPool* sp = sweeping_[i];
    poll_stream(*sp);
    if (sp->sweeps.empty())
      sp->sweeping = false;
    else
      sweeping_[kept++] = sp;
  }
  sweeping_.resize(kept);
}

void BlockPool::make_shared(Block* b) {
  remove_free(b);
  if (b->retired) {
    // The stream is done with the old addresses: drop the alias (the physical granules stay
    // mapped where they were re-used).
    Arena& a = *b->arena;
    std::size_t first = 0, last = 0;
    a.covering(b->addr, b->size, first, last);
    if (ctx_.config.dormant_maps == 0) {
      unmap_run(a, first, last - first);
    } else {
      for (std::size_t g = first; g < last;) {
        const Extent e = mapping_extent(a.phys(g), g);  // a whole chunk goes dormant whole
        make_dormant(a, g);
        g = e.first + e.count;
      }
    }
    b->retired = false;
  }
  if (merged_) {
    std::size_t first = 0, last = 0;
    b->arena->interior(b->addr, b->size, first, last);
    b->arena->stamp(first, last, {});
  }
  b->shared = true;
  b->lazy = false;  // shared blocks may lack granules anyway
  insert_free(coalesce(b));
}

void BlockPool::stamp(const Block* b) {
  if (!merged_) return;  // only memory first steals from owned blocks
  std::size_t first = 0, last = 0;
  b->arena->covering(b->addr, b->size, first, last);
  b->arena->stamp(first, last, {b->stream, b->free_seq});
}

bool BlockPool::finished(const Arena& a, std::size_t g) const {
  const Arena::FreeStamp st = a.stamp(g);
  if (st.seq == 0) return true;
  auto it = streams_.find(st.stream);
  return it != streams_.end() && st.seq <= it->second.done;
}

void BlockPool::synchronize() {
  // Finish pending sweeps, cover everything freed since, and finish those too.
  for (int round = 0; round < 2; ++round) {
    for (StreamPool* sp : sweeping_) {
      for (auto& [event, seq] : sp->sweeps) ctx_.backend.wait_event(event);
    }
    poll_sweeps();
    if (round == 0) record_sweeps();
  }
  ++ctx_.stats.num_sync_all_streams;
}

std::size_t BlockPool::release_cached() {
  if (segments_) return release_free_segments();
  while (!warm_.empty()) unmap_interior(warm_.front(), SIZE_MAX, Take::kAll);
  // Dormant mappings keep their chunks from being released.
  for (auto& arena : arenas_) {
    Arena& a = *arena;
    for (std::size_t g = 0; g < a.high_water();) {
      std::size_t end = g;
      while (end < a.high_water() && a.is_dormant(end)) ++end;
      if (end > g) unmap_run(a, g, end - g);
      g = end + 1;
    }
  }
  return phys_.release_idle_chunks();
}

std::size_t BlockPool::release_free_segments() {
  std::size_t released = 0;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    Block* b = arena_first_[i];
    Arena& a = *arenas_[i];
    if (b->is_free() && b->shared && b->size == a.size()) {  // the whole segment is free
      remove_free(b);
      delete b;
      ctx_.backend.free_segment(a.base(), a.size());
      ++ctx_.stats.num_device_free;
      ctx_.stats.segment[int(Pool::kAll)].decrease(1);
      ctx_.stats.segment[int(Pool::kLarge)].decrease(1);
      segment_bytes_ -= a.size();
      ctx_.add_reserved(Pool::kLarge, -std::int64_t(a.size()));
      released += a.size();
      continue;
    }
    arenas_[kept] = std::move(arenas_[i]);
    arena_first_[kept] = b;
    ++kept;
  }
  arenas_.resize(kept);
  arena_first_.resize(kept);
  ctx_.backend.trim();
  return released;
}

void BlockPool::mapped_runs(std::vector<std::pair<DevicePtr, std::size_t>>& out) const {
  for (const auto& arena : arenas_) {
    const Arena& a = *arena;
    std::size_t first = 0;
    bool open = false;
    for (std::size_t g = 0; g <= a.high_water(); ++g) {
      const bool mapped = g < a.high_water() && a.is_mapped(g);
      if (mapped && !open) {
        first = g;
        open = true;
      } else if (!mapped && open) {
        out.emplace_back(a.granule_addr(first), (g - first) * ctx_.granule);
        open = false;
      }
    }
  }
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
      if (!b->is_free()) {
        flush();
        continue;
      }
      scan_mapped(a, b->addr, std::min<DevicePtr>(b->end(), mapped_end), run, total, largest);
      if (b->end() > mapped_end) flush();
    }
    flush();
  }
}

void BlockPool::scan_mapped(const Arena& a, DevicePtr lo, DevicePtr hi, std::size_t& run,
                            std::size_t& total, std::size_t& largest) {
  for (DevicePtr pos = lo; pos < hi;) {
    const std::size_t g = a.granule_of(pos);
    const DevicePtr seg_end = std::min<DevicePtr>(hi, a.granule_addr(g + 1));
    if (a.is_mapped(g)) {
      run += seg_end - pos;
      total += seg_end - pos;
    } else {
      largest = std::max(largest, run);
      run = 0;
    }
    pos = seg_end;
  }
}

void BlockPool::mapped_extents(const Block* b, DevicePtr lo, DevicePtr hi, std::size_t& total,
                               std::size_t& largest) const {
  CUARENA_ASSERT(lo >= b->addr && hi <= b->end(), "mapped_extents: the run must lie inside b");
  std::size_t run = 0;
  scan_mapped(*b->arena, lo, hi, run, total, largest);
  largest = std::max(largest, run);
}

BlockPool::Breakdown BlockPool::breakdown() const {
  Breakdown out;
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = *arenas_[i];
    // Each mapped granule is counted once, under the most-used block overlapping it.
    std::vector<int> rank(a.high_water(), -1);
    for (const Block* b = arena_first_[i]; b != nullptr && b->addr < a.granule_addr(a.high_water());
         b = b->next) {
      const int r = b->allocated ? 3 : b->retired ? 2 : b->shared ? 0 : 1;
      std::size_t first = 0, last = 0;
      a.covering(b->addr, b->size, first, last);
      for (std::size_t g = first; g < std::min(last, a.high_water()); ++g)
        if (a.is_mapped(g)) rank[g] = std::max(rank[g], r);
    }
    for (int r : rank) {
      if (r == 3)
        out.allocated += ctx_.granule;
      else if (r == 2)
        out.retired += ctx_.granule;
      else if (r == 1)
        out.owned += ctx_.granule;
      else if (r == 0)
        out.shared += ctx_.granule;
    }
  }
  out.idle = (phys_.idle_granules() + phys_.idle_whole_granules()) * ctx_.granule;
  return out;
}

}  // namespace cuarena::detail
