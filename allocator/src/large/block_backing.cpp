// Backing a request: ensure_mapped's search order (dormant mappings, cached granules of shared
// blocks, idle whole chunks, the stream's own free memory, idle and fresh granules) and the
// steps that need blocks: which free block holds a granule, defragmenting free blocks,
// aliasing the stream's own. The steps that need none are the mappings layer's (mappings.cpp).
//
// Physical memory (PhysicalMemory) is never created while it can be found: a request first takes
// back its own dormant mappings whose granules are idle; past the defrag threshold it takes
// cached granules of shared blocks (oldest freed first); idle whole chunks back the runs of
// holes they fit; still short past the threshold, it aliases granules of its own stream's free
// blocks (retiring them: stream order makes that safe without waiting; the old mapping goes
// when a sweep shows the stream's earlier work done); then idle granules; and only then are
// chunks created (ensure_mapped). Mapping reclaimed granules under a fresh virtual range is
// GMLake's stitching (Guo et al., ASPLOS 2024).
//
// Dormant mappings (config dormant_maps): defragmenting a granule or dropping a retired alias
// leaves its mapping in place, dormant, instead of unmapping it. Only shared free blocks hold
// dormant granules (like unmapped ones, they count as holes). A request over a dormant granule
// whose physical granule is idle takes it back with no driver call, so a repeating workload
// stops paying for map/unmap once every layout it uses has been mapped once.
#include <algorithm>

#include "large/block_pool.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

const Block* BlockPool::free_holder(const Arena& a, std::size_t g) const {
  const DevicePtr at = a.granule_addr(g);
  const Block* b = index_.addressed_at_or_below(at);
  if (b == nullptr || b->arena != &a || b->end() < at + ctx_.granule) return nullptr;
  return b->shared || finished(a, g) ? b : nullptr;
}

const Block* BlockPool::active_holder(PhysRef p) const {
  const auto& active = mappings_.phys().active(p);
  if (active.size() != 1) return nullptr;
  const Arena& a = *active.front().arena;
  // A whole chunk moves only if one free block holds all of its active mapping.
  const Mappings::Extent e = mapping_extent(p, active.front().granule);
  const Block* b = free_holder(a, e.first);
  if (b == nullptr || b->end() < a.granule_addr(e.first + e.count)) return nullptr;
  // Every granule of the extent lies in b: only their finish needs a look (one lookup each).
  for (std::size_t k = e.first + 1; k < e.first + e.count && !b->shared; ++k)
    if (!finished(a, k)) return nullptr;
  return b;
}

bool BlockPool::finished(const Arena& a, std::size_t g) const {
  const Arena::FreeStamp st = a.stamp(g);
  if (st.seq == 0) return true;
  const StreamFreeLists* sp = index_.find_stream(st.stream);
  return sp != nullptr && st.seq <= sp->done;
}

std::size_t BlockPool::missing_granules(const Block* b, std::size_t size, std::size_t limit,
                                        std::size_t* unmapped) const {
  if (segments_) return 0;  // (a segment is backed whole: nothing unmapped either)
  const Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.covering(b->addr, size, first, last);
  std::size_t missing = 0;
  for (std::size_t g = a.next_inactive(first, last); g < last && missing < limit;
       g = a.next_inactive(g + 1, last)) {
    if (unmapped != nullptr) ++*unmapped;
    bool back = false;  // a dormant granule that comes back with no driver call
    if (a.is_dormant(g)) {
      const PhysRef p = a.phys(g);
      back = mappings_.idle(p) || active_holder(p) != nullptr;
    }
    missing += !back;
  }
  return missing;
}

bool BlockPool::ensure_mapped(Block* b, DevicePtr addr, std::size_t size, StreamId stream) {
  // b is detached (or allocated), so blocks that sweeps finishing on the way share cannot
  // coalesce it away. Memory is never created while it can be found:
  Backing r = holes_of(b, addr, size);
  // 1. The range's own dormant mappings, where their physical granules are free (no call).
  if (take_back_dormant(b, r)) return true;
  // 2. Past the defrag threshold, cached granules of free blocks, taken oldest freed first.
  const std::size_t threshold = defrag_threshold();
  if (ctx_.reserved() + shortfall(r, mappings_.idle_granules()) > threshold && defrag(b, r))
    return true;
  // 2b. Still past it, memory a loop plan's range holds mapped between its blocks.
  if (const std::size_t short_bytes = shortfall(r, mappings_.idle_granules());
      reclaimer_ != nullptr && ctx_.reserved() + short_bytes > threshold) {
    reclaimer_->reclaim(short_bytes / ctx_.granule, stream);
    reactivate(b, r.holes);  // a hole's own dormant granule may be among those freed
    if (r.holes.empty()) return true;
  }
  // Growing past whole_chunk_fraction of the limit: memory is short, so from now on it goes
  // memory-first (fewer bytes for more driver calls; docs/results.md).
  if (can_turn_memory_first() && ctx_.config.whole_chunk_fraction < 1.0 &&
      double(ctx_.reserved() + shortfall(r, mappings_.idle_granules())) >
          ctx_.config.whole_chunk_fraction * double(ctx_.limit))
    turn_memory_first();
  // 3. Idle whole chunks, for the runs of holes they fit.
  mappings_.pack_whole(r);
  // 4. Still short past the threshold: the stream's own free memory, mapped here too (memory
  // first, under the top edge granule as well where its free rest can become the stream's).
  if (ctx_.config.stream_alias) {
    if (!can_turn_memory_first()) aliasable_edge(b, addr, size, r);
    alias_own(r, stream, threshold);
  }
  // 5. Idle granules, then fresh chunks; refused past the limit.
  if (!mappings_.fill(r, threshold)) return false;
  // 6. One map call per run of holes, one access grant over nearby runs.
  mappings_.map(*b->arena, r);
  // Claimed whenever the request took aliases, the edge granule among them or not: claiming
  // only where it did moved the default's spread over lags the wrong way (bert_varlen_infer
  // 0.0028 -> 0.0056, resnet50_amp 0.0007 -> 0.0021; docs/results.md, 2026-12-07 (night)).
  if (r.edge && (!r.aliases.empty() || r.aliased_whole > 0)) claim_edge(b, r, stream);
  return true;
}

void BlockPool::aliasable_edge(const Block* b, DevicePtr addr, std::size_t size, Backing& r) const {
  // The top edge alone: requests are carved from the bottom of free blocks, so a granule
  // sticking out below one lies in another block's tail, which no bundled trace shows. The
  // rest of the granule must lie in one free block above b (not in b itself: a lazy range's
  // other blocks, not yet placed, may be another stream's).
  if (r.holes.empty()) return;
  const std::size_t g = r.holes.back();
  const Block* n = b->next;
  if (g < r.inner_last || addr + size != b->end() || n == nullptr || !n->is_free() || n->lazy ||
      n->end() < b->arena->granule_addr(g + 1))
    return;
  r.inner_last = g + 1;
  r.edge = true;
}

void BlockPool::claim_edge(Block* b, const Backing& r, StreamId stream) {
  const DevicePtr hi = b->arena->granule_addr(r.holes.back() + 1);
  Block* n = b->next;
  CUARENA_ASSERT(n != nullptr && n->is_free() && !n->lazy && n->end() >= hi,
                 "claim_edge: the rest of the edge granule lies in one free block");
  // The rest becomes the stream's, freed now: another stream may use it only after a sweep
  // recorded from now on shows the aliased granule's earlier work done.
  const bool was_warm = n->shared || Lru::contains(n);
  Block* fifo_pos = n->shared ? nullptr : Fifo::next(n);
  index_.remove(n);
  if (n->end() > hi) index_.insert(index_.split_off(n, hi), fifo_pos, was_warm);
  free_now(n, index_.stream(stream));  // a neighbour it absorbs is the stream's, freed now, too
}

Backing BlockPool::holes_of(const Block* b, DevicePtr addr, std::size_t size) const {
  Backing r;
  const Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.covering(addr, size, first, last);
  for (std::size_t g = a.next_inactive(first, last); g < last; g = a.next_inactive(g + 1, last))
    r.holes.push_back(g);
  a.interior(addr, size, r.inner_first, r.inner_last);
  return r;
}

bool BlockPool::take_back_dormant(Block* b, Backing& r) {
  reactivate(b, r.holes);
  // Finished sweeps let more dormant granules come back with no driver call.
  if (index_.unified() && !r.holes.empty()) sharing_.poll_sweeps();
  reclaim_dormant(*b->arena, r.holes);
  reactivate(b, r.holes);
  return r.holes.empty();
}

std::size_t BlockPool::defrag_threshold() const {
  // Growing is allowed below the configured threshold (ctx_.defrag_threshold_bytes:
  // defrag_threshold of the limit) and below the slack over the peak of allocated bytes; past both,
  // cached granules are reused first. Placing whole chunks (not memory-first), the slack is at
  // least tuning::kWholeChunkCacheSlack.
  const double slack = std::max(ctx_.config.cache_slack,
                                can_turn_memory_first() ? tuning::kWholeChunkCacheSlack : 0.0);
  const auto slack_limit = static_cast<std::size_t>(
      (1.0 + slack) * double(ctx_.stats.allocated_bytes[int(Pool::kAll)].peak));
  return std::max(ctx_.defrag_threshold_bytes, slack > 0 ? slack_limit : 0);
}

std::size_t BlockPool::shortfall(const Backing& r, std::size_t have) const {
  const std::size_t need = r.holes.size();
  return (need - std::min(need, have)) * ctx_.granule;
}

bool BlockPool::defrag(Block* b, Backing& r) {
  // Poll before recording: a sweep recorded just now finishes at a time only the device
  // knows, and a decision taken on it would differ between the GPU and the simulator.
  sharing_.poll_sweeps();
  sharing_.record_sweeps();
  const std::size_t before = mappings_.idle_granules();
  defrag_pass(r.holes.size());
  r.reclaimed_idle = mappings_.idle_granules() - std::min(before, mappings_.idle_granules());
  // The pass may have freed the very granules some holes map dormant.
  reactivate(b, r.holes);
  return r.holes.empty();
}

void BlockPool::alias_own(Backing& r, StreamId stream, std::size_t threshold) {
  const std::size_t need = r.holes.size();
  const std::size_t idle = mappings_.phys().idle_granules();
  const std::size_t short_of = need - r.packed > idle ? need - r.packed - idle : 0;
  if (short_of == 0 || ctx_.reserved() + short_of * ctx_.granule <= threshold) return;
  std::vector<std::size_t> open;  // unfilled holes wholly inside the request
  for (std::size_t i = 0; i < need; ++i) {
    if (!r.supply[i].valid() && r.inside(r.holes[i])) open.push_back(i);
  }
  if (open.empty()) return;
  StreamFreeLists& sp = index_.stream(stream);
  r.aliased_whole = alias_whole(sp, r.holes, open, short_of, r.supply);
  r.packed += r.aliased_whole;
  const std::size_t left = need - r.packed > idle ? need - r.packed - idle : 0;
  std::size_t inner_open = 0;
  for (std::size_t i : open) inner_open += !r.supply[i].valid();
  const std::size_t want = std::min(left, inner_open);
  // Aliasing cannot be undone until the sweep: only start if it lets the request fit.
  if (want > 0 &&
      ctx_.reserved() + shortfall(r, r.packed + idle + aliasable(sp, want)) <= ctx_.limit)
    alias(sp, want, r.aliases);
}

void BlockPool::reactivate(Block* b, std::vector<std::size_t>& holes) {
  bool spilled = false;  // a whole chunk came back active past the holes, in a free neighbour
  if (mappings_.reactivate(*b->arena, holes, spilled) == 0 || !spilled) return;
  // Active granules in a shared free block must be findable by defrag_pass().
  for (Block* nb : {b->prev, b->next}) {
    if (nb != nullptr && nb->is_free() && nb->shared && !Lru::contains(nb))
      index_.warm().push_back(nb);
  }
}

void BlockPool::reclaim_dormant(const Arena& a, const std::vector<std::size_t>& holes) {
  for (const std::size_t h : holes) {
    if (!a.is_dormant(h)) continue;
    const PhysRef p = a.phys(h);
    const Block* holder = active_holder(p);
    if (holder == nullptr) continue;
    const PhysicalMemory::Mapping m = mappings_.phys().active(p).front();
    mappings_.make_dormant(*holder->arena, m.granule);
    ctx_.stats.granules_stolen += std::int64_t(mapping_extent(p, h).count);
  }
}

void BlockPool::defrag_pass(std::size_t target) {
  ++ctx_.stats.defrag_passes;
  // Single granules first; whole chunks (which become idle whole chunks, and may fit no run of
  // the request's holes) only if that is not enough.
  auto idle = [&] { return mappings_.idle_granules(); };
  const std::size_t before = idle();
  auto short_by = [&] { return idle() < target ? target - idle() : 0; };
  for (Take take : {Take::kMovable, Take::kWholeToo}) {
    for (Block* b = index_.warm().front(); b != nullptr && short_by() > 0;) {
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
    return a.is_mapped(g) && !mappings_.phys().whole(a.phys(g).chunk) && ready(g);
  };
  // Take from the top so the low end, which best fit reuses first, stays mapped.
  for (std::size_t g = last; g > first;) {
    if (!a.is_mapped(g - 1) || !ready(g - 1)) {
      --g;
      continue;
    }
    const PhysRef top = a.phys(g - 1);
    if (mappings_.phys().whole(top.chunk)) {
      // A whole chunk goes all at once, and only if the block holds all of it.
      const auto [start, n] = mapping_extent(top, g - 1);
      bool all_ready = true;
      for (std::size_t k = start; k < start + n && all_ready; ++k) all_ready = ready(k);
      if (start >= first && start + n <= last && all_ready) {
        if (take == Take::kMovable || (limited && got >= max_granules)) {
          remaining = true;
        } else {
          if (take == Take::kAll)
            mappings_.unmap(a, start, n);
          else
            mappings_.make_dormant(a, start);  // idle as one piece, for a run it fits
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
      mappings_.unmap(a, g, end - g);
    else
      for (std::size_t k = g; k < end; ++k) mappings_.make_dormant(a, k);
    got += end - g;
  }
  if (!remaining && Lru::contains(b)) index_.warm().erase(b);
}

std::size_t BlockPool::alias_whole(StreamFreeLists& sp, const std::vector<std::size_t>& holes,
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
    last = std::min(last, a.high_water());  // an absorbed free tail may span the reservation
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
    retire(sp, it->block, it->granule,
           it->granule + mappings_.phys().granules(a.phys(it->granule).chunk));
  }
  return got;
}

void BlockPool::retire(StreamFreeLists& sp, Block* f, std::size_t g0, std::size_t g1) {
  const Arena& a = *f->arena;
  Block* next = Fifo::next(f);              // the pieces keep f's place in the free order
  index_.remove(f, /*keep_address=*/true);  // f stays free there, or becomes `mid`
  Block* mid = f;
  if (a.granule_addr(g0) > f->addr) {
    mid = index_.split_off(f, a.granule_addr(g0));
    index_.insert(f, next);
  }
  if (a.granule_addr(g1) < mid->end())
    index_.insert(index_.split_off(mid, a.granule_addr(g1)), next);
  mid->retired = true;
  mid->lazy = false;  // its granules are mapped: that is what it lends
  mid->free_seq = sharing_.note_free(sp);
  stamp(mid);
  index_.insert(mid);  // back of the retired list: waits for a sweep recorded from now on
}

std::size_t BlockPool::aliasable(const StreamFreeLists& sp, std::size_t max) const {
  std::size_t n = 0;
  for (const Block* f = sp.fifo.front(); f != nullptr && n < max; f = Fifo::next(f)) {
    std::size_t first = 0, last = 0;
    f->arena->interior(f->addr, f->size, first, last);
    last = std::min(last, f->arena->high_water());
    for (std::size_t g = first; g < last && n < max; ++g)
      n += f->arena->is_mapped(g) && !mappings_.phys().whole(f->arena->phys(g).chunk);
  }
  return std::min(n, max);
}

std::size_t BlockPool::alias(StreamFreeLists& sp, std::size_t want, std::vector<PhysRef>& out) {
  std::size_t got = 0;
  for (Block* f = sp.fifo.front(); f != nullptr && got < want;) {
    Block* next = Fifo::next(f);
    Arena& a = *f->arena;
    std::size_t first = 0, last = 0;
    a.interior(f->addr, f->size, first, last);
    last = std::min(last, a.high_water());
    // Runs of actively mapped single granules (whole chunks go through alias_whole), from
    // the top down, until what is wanted: each run retired leaves the block below it owned.
    auto single = [&](std::size_t g) {
      return a.is_mapped(g) && !mappings_.phys().whole(a.phys(g).chunk);
    };
    while (got < want) {
      while (last > first && !single(last - 1)) --last;
      std::size_t g0 = last;
      while (g0 > first && last - g0 < want - got && single(g0 - 1)) --g0;
      if (last == g0) break;
      for (std::size_t g = g0; g < last; ++g) out.push_back(a.phys(g));
      got += last - g0;
      const bool whole = a.granule_addr(g0) <= f->addr;
      retire(sp, f, g0, last);
      if (whole) break;
      last = g0;
    }
    f = next;
  }
  return got;
}

}  // namespace cuarena::detail
