#include "large/block_pool.hpp"

#include <algorithm>
#include <bit>

#include "cuarena/errors.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

BlockPool::BlockPool(Context& ctx)
    : ctx_(ctx),
      mappings_(ctx),
      segments_(!ctx.backend.supports_mapping()),
      // Unified placement by the config, and always with memory first.
      index_(segments_, !segments_ && (ctx.config.whole_chunk_min == 0 ||
                                       ctx.config.placement == cuarena::Placement::kUnified)),
      sharing_(ctx, index_, /*lazy=*/!segments_, [this](Block* b) { make_shared(b); }) {
  const auto missing = [this](const Block* b, std::size_t size, std::size_t limit,
                              std::size_t* unmapped) {
    return missing_granules(b, size, limit, unmapped);
  };
  unified_placement_ = BlockPlacement::make(cuarena::Placement::kUnified, index_, missing);
  own_first_placement_ = BlockPlacement::make(cuarena::Placement::kOwnFirst, index_, missing);
  if (!segments_ && ctx.config.whole_chunk_min == 0) ctx_.stats.memory_first = 1;
}

BlockPool::~BlockPool() {
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    mappings_.release(*arenas_[i]);
    for (Block* b = index_.firsts()[i]; b != nullptr;) {
      Block* next = b->next;
      index_.delete_block(b);
      b = next;
    }
  }
  // mappings_ (a member) releases the chunks, sweeps_ the events, after this body.
}

Block* BlockPool::new_arena(std::size_t min_size, StreamId stream) {
  const std::size_t g = ctx_.granule;
  if (segments_) return new_segment(min_size, stream);
  std::size_t bytes = ctx_.config.va_reserve;
  if (bytes == 0) bytes = tuning::kVaReserveFactor * ctx_.backend.capacity();
  bytes = round_up(std::max(bytes, min_size), g);
  arenas_.push_back(mappings_.reserve(bytes));
  return add_arena_block();
}

Block* BlockPool::new_segment(std::size_t min_size, StreamId stream) {
  // PyTorch's segment sizes (tuning::segment_rule); near the limit, only the size.
  const std::size_t g = ctx_.granule;
  std::size_t bytes =
      std::max(segment_size(min_size, tuning::segment_rule(g)), round_up(min_size, g));
  const std::size_t cap = std::min(ctx_.limit, ctx_.grow_ceiling);  // (wait_before_grow)
  if (ctx_.reserved() + bytes > cap) bytes = round_up(min_size, g);
  if (ctx_.reserved() + bytes > cap) return nullptr;
  std::unique_ptr<Arena> a = mappings_.allocate_segment(bytes, stream);
  if (a == nullptr) return nullptr;
  arenas_.push_back(std::move(a));
  return add_arena_block();
}

Block* BlockPool::add_arena_block() {
  ctx_.stats.segment[int(Pool::kAll)].increase(1);
  ctx_.stats.segment[int(Pool::kLarge)].increase(1);
  return index_.tile(*arenas_.back());
}

Block* BlockPool::coalesce(Block* b) {
  return index_.coalesce(
      b, [&](const Block* n) { return sharing_.owes(n); },
      [&](const Block* owned, const Block* n) {
        // Segment mode: any shared neighbour (a segment is backed whole).
        return segments_ || placement().absorbs(*owned, *n);
      },
      [&](const Block* at, bool owned) { sharing_.before_coalesce(at, owned); });
}

Block* BlockPool::split_allocated(Block* b, DevicePtr at) {
  CUARENA_ASSERT(b->allocated && at > b->addr && at < b->end() && at % kMinBlockSize == 0,
                 "split_allocated: the cut must lie strictly inside an allocated block");
  Block* r = index_.split_off(b, at);
  r->allocated = true;
  return r;
}

bool BlockPool::needs_backing(const Block* b) const {
  // A shared block can lack granules; placed unified, an owned one can too (it may have
  // absorbed a shared neighbour); a lazy one can in both modes.
  return b->shared || index_.unified() || b->lazy;
}

namespace {
// Any block of size + alignment_pad(alignment) bytes holds an aligned range of `size` (block
// addresses are multiples of 512).
std::size_t alignment_pad(std::size_t alignment) {
  return alignment > kMinBlockSize ? alignment - kMinBlockSize : 0;
}
}  // namespace

Block* BlockPool::try_allocate(std::size_t size, StreamId stream, std::size_t alignment) {
  CUARENA_ASSERT(size % kMinBlockSize == 0 && std::has_single_bit(alignment),
                 "try_allocate: size a multiple of 512, alignment a power of two");
  const std::size_t pad = alignment_pad(alignment);
  if (size > ctx_.limit || pad > ctx_.limit - size)
    return nullptr;  // can never fit: do not even reserve address space
  const std::size_t span = size + pad;
  sharing_.settle();
  StreamFreeLists& sp = index_.stream(stream);
  // A miss on the stream's own blocks first lets finished streams' blocks become shared.
  if (sp.free.lower_bound(span) == sp.free.end()) sharing_.poll_sweeps();
  bool mapped = false;  // the placement found every granule of the range active
  Block* b = placement().place(sp, span, mapped);
  // allocate_cached(): a block that needs no backing, else nothing is taken or made.
  if (ctx_.cached_only && (b == nullptr || (needs_backing(b) && !mapped) ||
                           b->size > std::max(span, ctx_.cached_max_block)))
    return nullptr;
  if (b == nullptr) b = new_arena(span, stream);
  if (b == nullptr) return nullptr;  // a segment backend refused
  // Detach b (marked allocated) before anything can coalesce it away, and split off the
  // remainder first, so its cached granules can be defragmented for this very request.
  const bool backing = needs_backing(b);
  const bool was_shared = b->shared;
  const bool was_warm = Lru::contains(b);
  Block* fifo_pos = was_shared ? nullptr : Fifo::next(b);
  index_.remove(b);
  if (const DevicePtr at = round_up(b->addr, alignment); at != b->addr) {
    // The unaligned head stays free, in b's place and state (its neighbour below is not free:
    // b was coalesced).
    Block* body = index_.split_off(b, at);
    index_.insert(b, fifo_pos, was_shared || was_warm);
    b = body;
  }
  if (b->size > size)
    index_.insert(index_.split_off(b, b->addr + size), fifo_pos, was_shared || was_warm);
  b->allocated = true;
  if (backing && !mapped && !ensure_mapped(b, b->addr, size, stream)) {
    b->allocated = false;
    index_.reinsert(coalesce(b));  // with its old free_seq: in order, not newest
    return nullptr;
  }
  b->lazy = false;
  if (b->used && b->stream != stream) ++ctx_.stats.cross_stream_reuses;
  b->shared = false;
  b->used = true;
  b->stream = stream;
  return b;
}

bool BlockPool::others_hold_frees(StreamId stream) const {
  for (const auto& [id, sp] : index_.streams()) {
    if (id != stream && (!sp.fifo.empty() || !sp.retired.empty())) return true;
  }
  return false;
}

bool BlockPool::adopt_free(StreamId stream, std::size_t size, std::size_t alignment) {
  if (!ctx_.backend.supports_stream_waits()) return false;
  // A captured stream's work runs at replay: no event of now can order it (nor one recorded
  // into the capture order work outside it).
  if (ctx_.backend.stream_capturing(stream)) return false;
  sharing_.settle();
  const std::size_t span = size + alignment_pad(alignment);
  // The best fit over the other streams' owned blocks: taking more would leave their own
  // streams short, and they would take back in turn. Candidates smallest first, so a stream
  // being captured (asked only when its block would be taken) is passed over.
  adopt_candidates_.clear();
  for (auto& [id, sp] : index_.streams()) {
    if (id == stream) continue;
    const auto it = sp.free.lower_bound(span);
    if (it != sp.free.end()) adopt_candidates_.emplace_back(*it, &sp);
  }
  std::sort(adopt_candidates_.begin(), adopt_candidates_.end(),
            [](const auto& a, const auto& b) { return a.first->size < b.first->size; });
  for (const auto& [block, from] : adopt_candidates_) {
    if (ctx_.backend.stream_capturing(from->id)) continue;
    const EventId e = ctx_.backend.record_event(from->id);
    ++ctx_.stats.events_recorded;
    const bool ordered = ctx_.backend.stream_wait_event(stream, e);
    ctx_.backend.release_event(e);
    if (!ordered) return false;
    StreamFreeLists& sp = index_.stream(stream);
    index_.remove(block);
    free_now(block, sp);
    sharing_.after_free(sp);  // as any free: its stream's sweep stays in step
    return true;
  }
  return false;
}

void BlockPool::deallocate(Block* b) {
  StreamFreeLists& sp = index_.stream(b->stream);
  b->allocated = false;
  free_now(b, sp);
  sharing_.after_free(sp);
}

void BlockPool::free_now(Block* b, StreamFreeLists& sp) {
  b->shared = false;
  b->stream = sp.id;
  b->free_seq = sharing_.note_free(sp);
  stamp(b);
  index_.insert(coalesce(b));  // newest free_seq: the FIFO's back keeps it sorted
}

Block* BlockPool::reserve_lazy(std::size_t size, StreamId stream) {
  if (segments_) return try_allocate(size, stream);
  if (size > ctx_.limit) return nullptr;
  sharing_.settle();
  // The range gets an arena of its own, so the pool's blocks stay where they would be: one an
  // earlier plan left wholly free with nothing mapped (not even dormant), else a new one. (A
  // plan is made again after every empty_cache(), and arenas are never given back.)
  Block* b = nullptr;
  for (std::size_t i = 0; i < arenas_.size() && b == nullptr; ++i) {
    Block* f = index_.firsts()[i];
    if (f->next != nullptr || !f->is_free() || !f->shared || f->size < size) continue;
    const Arena& a = *arenas_[i];
    bool empty = true;
    for (std::size_t k = 0; k < a.high_water() && empty; ++k) empty = !a.has_mapping(k);
    if (empty) b = f;
  }
  if (b == nullptr) {
    try {
      b = new_arena(size, stream);
    } catch (const BackendError&) {
      return nullptr;  // no address space for a range of its own: requests go to the pool
    }
  }
  const DevicePtr at = b->addr;
  index_.remove(b);
  if (b->size > size) index_.insert(index_.split_off(b, at + size), nullptr, /*warm=*/false);
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
  sharing_.settle();
  return ensure_mapped(b, addr, size, stream);
}

std::size_t BlockPool::idle_unused(Block* b, DevicePtr lo, DevicePtr hi, std::size_t max_granules,
                                   std::vector<DevicePtr>& taken) {
  CUARENA_ASSERT(b->allocated && b->lazy && lo >= b->addr && hi <= b->end() && lo <= hi,
                 "idle_unused: the run must lie inside a lazy allocated block");
  Arena& a = *b->arena;
  std::size_t first = 0, last = 0;
  a.interior(lo, hi - lo, first, last);
  last = std::min(last, a.high_water());
  const std::size_t before = mappings_.idle_granules();
  auto made = [&] {
    return mappings_.idle_granules() - std::min(before, mappings_.idle_granules());
  };
  // From the top, as unmap_interior does: the low end is what best fit reuses first.
  for (std::size_t g = last; g > first && made() < max_granules;) {
    if (!a.is_mapped(g - 1)) {
      --g;
      continue;
    }
    const Mappings::Extent e = mapping_extent(a.phys(g - 1), g - 1);
    if (e.first >= first && e.first + e.count <= g) {  // all of its mapping lies in the run
      for (std::size_t k = e.first; k < e.first + e.count; ++k) taken.push_back(a.granule_addr(k));
      if (ctx_.config.dormant_maps == 0)
        mappings_.unmap(a, e.first, e.count);
      else
        mappings_.make_dormant(a, e.first);
    }
    g = e.first > first ? e.first : first;
  }
  ctx_.stats.granules_stolen += std::int64_t(made());
  return made();
}

bool BlockPool::backed(const Block* b, DevicePtr addr, std::size_t size) const {
  std::size_t first = 0, last = 0;
  b->arena->covering(addr, size, first, last);
  return b->arena->count_unmapped(first, last) == 0;
}

void BlockPool::make_shared(Block* b) {
  index_.remove(b, /*keep_address=*/true);  // it stays free there
  if (b->retired) {
    // The stream is done with the old addresses: drop the alias (the physical granules stay
    // mapped where they were re-used).
    Arena& a = *b->arena;
    std::size_t first = 0, last = 0;
    a.covering(b->addr, b->size, first, last);
    if (ctx_.config.dormant_maps == 0) {
      mappings_.unmap(a, first, last - first);
    } else {
      for (std::size_t g = first; g < last;) {
        const Mappings::Extent e = mapping_extent(a.phys(g), g);  // a whole chunk goes whole
        mappings_.make_dormant(a, g);
        g = e.first + e.count;
      }
    }
    b->retired = false;
  }
  if (index_.unified()) {
    std::size_t first = 0, last = 0;
    b->arena->interior(b->addr, b->size, first, last);
    b->arena->stamp(first, last, {});
  }
  b->shared = true;
  b->lazy = false;  // shared blocks may lack granules anyway
  index_.insert(coalesce(b));
}

void BlockPool::stamp(const Block* b) {
  if (!index_.unified()) return;  // only unified placement defragments owned blocks
  std::size_t first = 0, last = 0;
  b->arena->covering(b->addr, b->size, first, last);
  b->arena->stamp(first, last, {b->stream, b->free_seq});
}

void BlockPool::turn_memory_first() {
  if (!can_turn_memory_first()) return;
  sharing_.settle();
  turned_ = true;
  ctx_.stats.memory_first = 1;
  mappings_.stop_whole_chunks();
  if (index_.unified()) return;  // placed unified already
  index_.set_unified(true);
  // What unified placement keeps for owned free blocks and own-first did not: an index by
  // address, a place in warm() (defrag_pass() looks there for finished granules), and the
  // stamps that say when their granules are finished (unstamped granules read as finished).
  for (auto& [id, sp] : index_.streams()) {
    for (Block* b = sp.fifo.front(); b != nullptr; b = Fifo::next(b)) {  // oldest freed first
      stamp(b);
      index_.index_address(b);
      if (!Lru::contains(b)) index_.warm().push_back(b);
    }
    for (Block* b = sp.retired.front(); b != nullptr; b = Fifo::next(b)) stamp(b);
  }
}

std::size_t BlockPool::release_cached() {
  sharing_.settle();
  if (segments_) return release_free_segments();
  while (!index_.warm().empty()) unmap_interior(index_.warm().front(), SIZE_MAX, Take::kAll);
  // Dormant mappings keep their chunks from being released.
  for (auto& arena : arenas_) mappings_.unmap_all_dormant(*arena);
  const std::size_t released = mappings_.release_idle_chunks();
  // A pool that turned memory-first when it ran short goes back to the default once it holds
  // less than half of where it turned, if no free block is owned (own-first placement keeps
  // owned free blocks fully mapped; empty_cache() has waited for every stream, so none is left
  // then).
  if (!turned_ || double(ctx_.reserved()) >= tuning::kMemoryFirstTurnBackShare *
                                                 ctx_.config.whole_chunk_fraction *
                                                 double(ctx_.limit))
    return released;
  for (const auto& [id, sp] : index_.streams()) {
    if (!sp.fifo.empty() || !sp.retired.empty()) return released;
  }
  turned_ = false;
  // whole_chunk_min != 0 here (it turned): the config's placement again.
  index_.set_unified(ctx_.config.placement == cuarena::Placement::kUnified);
  ctx_.stats.memory_first = 0;
  mappings_.resume_whole_chunks();
  return released;
}

std::size_t BlockPool::release_free_segments() {
  std::size_t released = 0;
  std::size_t kept = 0;
  std::vector<Block*>& firsts = index_.firsts();
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    Block* b = firsts[i];
    Arena& a = *arenas_[i];
    if (b->is_free() && b->shared && b->size == a.size()) {  // the whole segment is free
      index_.remove(b);
      index_.delete_block(b);
      mappings_.free_segment(a);
      ctx_.stats.segment[int(Pool::kAll)].decrease(1);
      ctx_.stats.segment[int(Pool::kLarge)].decrease(1);
      released += a.size();
      continue;
    }
    arenas_[kept] = std::move(arenas_[i]);
    firsts[kept] = b;
    ++kept;
  }
  arenas_.resize(kept);
  firsts.resize(kept);
  mappings_.trim();
  return released;
}

}  // namespace cuarena::detail
