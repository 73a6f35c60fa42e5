#include "large/block_pool.hpp"

#include <algorithm>

#include "tuning.hpp"

namespace cuarena::detail {

namespace {
using Fifo = IntrusiveList<Block, &Block::fifo>;
using Lru = IntrusiveList<Block, &Block::lru>;
}  // namespace

BlockPool::~BlockPool() {
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    mappings_.release(*arenas_[i]);
    for (Block* b = arena_first_[i]; b != nullptr;) {
      Block* next = b->next;
      delete_block(b);
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
  if (ctx_.reserved() + bytes > ctx_.limit) bytes = round_up(min_size, g);
  if (ctx_.reserved() + bytes > ctx_.limit) return nullptr;
  std::unique_ptr<Arena> a = mappings_.allocate_segment(bytes, stream);
  if (a == nullptr) return nullptr;
  arenas_.push_back(std::move(a));
  return add_arena_block();
}

Block* BlockPool::add_arena_block() {
  const Arena& a = *arenas_.back();
  Block* b = new_block();
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

void BlockPool::index_address(Block* b) {
  if (!addressable(b)) {
    unaddress(b);
  } else if (!b->addressed) {
    free_by_addr_.emplace(b->addr, b);
    b->addressed = true;
  }
}

void BlockPool::insert_free(Block* b, Block* fifo_pos, bool warm) {
  index_address(b);
  if (b->shared) {
    ++free_blocks_;
    shared_free_.insert(b);
    if (warm && !b->arena->segment()) warm_.insert_before(warm_before_, b);  // segments never unmap
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
  // Placed unified, it may hold finished granules (of a shared block it absorbed): steal() looks.
  if (merged_ && warm) warm_.insert_before(warm_before_, b);
}

void BlockPool::remove_free(Block* b, bool keep_address) {
  if (!keep_address) unaddress(b);
  if (b->shared) {
    --free_blocks_;
    shared_free_.erase(b);
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
  if (Lru::contains(b)) warm_.erase(b);
}

bool BlockPool::mergeable(const Block* a, const Block* b) const {
  if (!a->is_free() || !b->is_free() || a->shared != b->shared) return false;
  // A block whose sharing is owed waits for it before merging with anything.
  return a->shared || (a->stream == b->stream && !owes(a) && !owes(b));
}

void BlockPool::absorb(Block* lower, Block* upper) {
  lower->size += upper->size;
  lower->next = upper->next;
  if (upper->next) upper->next->prev = lower;
  lower->free_seq = std::max(lower->free_seq, upper->free_seq);
  lower->used = lower->used || upper->used;
  lower->lazy = lower->lazy || upper->lazy;
  delete_block(upper);
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
  for (;;) {
    // A neighbour may be owed by a check left unpolled: poll it, so owes() is exact.
    if (!owed_.empty() && near(b, [&](const Block* n) { return unpolled(n); })) poll_unpolled();
    // Placed unified, what b absorbs depends on what owed sharing would have merged: share first.
    if (merged_ && owned && !owed_.empty() && near(b, [&](const Block* n) { return owes(n); }))
      settle();
    if (!absorbable(b->prev) && !absorbable(b->next)) break;
    if (absorbable(b->prev)) {
      Block* p = b->prev;
      crossed |= p->shared != shared;
      remove_free(p, /*keep_address=*/true);  // p stays free at its address
      unaddress(b);
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
  Block* r = new_block();
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
  settle();
  StreamPool& sp = stream_pool(stream);
  // A miss on the stream's own blocks first lets finished streams' blocks become shared.
  if (sp.free.lower_bound(size) == sp.free.end()) poll_sweeps();
  bool mapped = false;  // the placement found every granule of the range active
  Block* b = merged_ ? best_fit(sp, size, mapped) : own_then_shared(sp, size, mapped);
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
  // A shared block can lack granules; placed unified, an owned one can too (it may have
  // absorbed a shared neighbour); a lazy one can in both modes.
  if ((was_shared || merged_ || b->lazy) && !mapped && !ensure_mapped(b, b->addr, size, stream)) {
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

Block* BlockPool::own_then_shared(StreamPool& sp, std::size_t size, bool& mapped) {
  auto own = sp.free.lower_bound(size);
  Block* b = own == sp.free.end() ? nullptr : *own;
  mapped = b != nullptr && !b->lazy;  // owned blocks are fully mapped here
  if (b != nullptr && b->size > size) {
    // A tighter shared block that needs no new memory beats a looser owned one, as one best fit
    // over both would choose (PyTorch's single best fit): splitting a looser block than needed
    // costs 8-12% more memory on the bundled training traces.
    auto it = shared_free_.lower_bound(size);
    if (it != shared_free_.end() && (*it)->size < b->size && missing_granules(*it, size, 1) == 0) {
      b = *it;
      mapped = false;
    }
  }
  if (b != nullptr) return b;
  // No own block fits, so best_fit() sees only the shared ones: among the few smallest, the one
  // missing fewest granules (best fit by size alone would often pick a block whose granules were
  // stolen over a slightly larger one still backed, and stealing for it moves memory every
  // iteration).
  return best_fit(sp, size, mapped);
}

Block* BlockPool::best_fit(StreamPool& sp, std::size_t size, bool& mapped) {
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
  mapped = false;
  for (int seen = 0; seen < candidates; ++seen) {
    const bool own_left = own != sp.free.end(), shared_left = shared != shared_free_.end();
    if (!own_left && !shared_left) break;
    Block* c = nullptr;
    // Equal sizes: the stream's own block first (it needs no event to be reused).
    if (own_left && (!shared_left || (*own)->size <= (*shared)->size))
      c = *own++;
    else
      c = *shared++;
    std::size_t unmapped = 0;
    const std::size_t missing = missing_granules(c, size, best_missing, &unmapped);
    if (missing < best_missing) {  // the scan ran to the end: unmapped is exact
      best = c;
      best_missing = missing;
      mapped = unmapped == 0;
      if (missing == 0) break;
    }
  }
  return best;
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

void BlockPool::deallocate(Block* b) {
  const StreamId stream = b->stream;
  StreamPool& sp = stream_pool(stream);
  b->allocated = false;
  b->shared = false;
  b->free_seq = sweeps_.note_free(sp);
  stamp(b);
  insert_free(coalesce(b));  // newest free_seq: the FIFO's back keeps it sorted
  // Keep one sweep in flight per stream, checked every sweep_interval frees, so blocks freed a
  // while ago are already shared when another stream or a shortage needs them.
  if (sp.seq % ctx_.config.sweep_interval != 0) return;
  if (lazy_shares()) {
    // The poll and the sharing are owed to the pool's next request (settle()): only a request can
    // reuse what is shared, and the free stays a few set operations and one event record.
    if (sp.unpolled_reach != 0) {  // the check before, with no request since: poll it now
      for (auto it = owed_.rbegin(); it != owed_.rend(); ++it) {
        if (it->sp == &sp && it->polls != 0) {
          poll_owed(*it);
          break;
        }
      }
    }
    // Placed unified, warm_'s order is the order blocks were shared in: mark this check.
    const auto sentinel = [&] { return merged_ ? push_sentinel() : nullptr; };
    if (sp.events.size() < tuning::kMaxSweepsPerStream) {
      if (!sp.events.empty()) {
        owed_.push_back({&sp, 0, sentinel(), sp.events.size()});
        sp.unpolled_reach = sp.events.back().second;
      }
    } else {  // full: the record below supersedes the newest sweep, so poll them now
      sweeps_.poll(sp, [&](std::uint64_t covered) {
        owed_.push_back({&sp, covered, sentinel(), 0});
      });
    }
    // A long run of frees with no request in between settles now and then, to bound owed_.
    if (owed_.size() > tuning::kMaxOwedShares) settle();
  } else {
    poll_stream(sp);
  }
  start_sweep(sp);
}

void BlockPool::settle() {
  if (owed_.empty()) return;
  // In the order the sweeps completed, as if each had been shared at its poll. (Sharing coalesces
  // only shared blocks, so the entries still to come need not be owed meanwhile.)
  std::vector<Owed> owed;
  owed.swap(owed_);
  for (Owed& o : owed) {
    if (o.polls != 0) poll_owed(o);
    warm_before_ = o.sentinel;
    share_covered(*o.sp, o.covered);
    if (o.sentinel != nullptr) drop_sentinel(o.sentinel);
  }
  warm_before_ = nullptr;
  owed.clear();
  if (owed_.empty()) owed_.swap(owed);  // keep the capacity
}

Block* BlockPool::push_sentinel() {
  if (spare_sentinels_.empty()) {
    sentinels_.push_back(std::make_unique<Block>());
    spare_sentinels_.push_back(sentinels_.back().get());
  }
  Block* sentinel = spare_sentinels_.back();
  spare_sentinels_.pop_back();
  warm_.push_back(sentinel);
  return sentinel;
}

void BlockPool::drop_sentinel(Block* sentinel) {
  warm_.erase(sentinel);
  spare_sentinels_.push_back(sentinel);
}

void BlockPool::poll_owed(Owed& o) {
  CUARENA_ASSERT(o.polls <= o.sp->events.size() && o.sp->unpolled_reach != 0,
                 "poll_owed: the stream's sweeps were polled since its check");
  sweeps_.poll(
      *o.sp, [&](std::uint64_t covered) { o.covered = covered; }, o.polls);
  o.polls = 0;
  o.sp->unpolled_reach = 0;
}

void BlockPool::poll_unpolled() {
  for (Owed& o : owed_) {
    if (o.polls != 0) poll_owed(o);
  }
}

template <class Pred>
bool BlockPool::near(const Block* b, Pred&& pred) const {
  for (const Block* n : {b->prev, b->next}) {
    if (n == nullptr || n->allocated) continue;
    if (pred(n)) return true;  // an owned free or retired block
    const Block* far = n == b->prev ? n->prev : n->next;
    if (n->shared && far != nullptr && pred(far)) return true;
  }
  return false;
}

const BlockPool::StreamPool* BlockPool::free_owner(const Block* b) const {
  if (b->allocated || b->shared) return nullptr;
  // A free's neighbours are mostly its own stream's: stream_pool()'s cache skips the hash lookup.
  if (last_sp_ != nullptr && b->stream == last_stream_) return last_sp_;
  const auto it = streams_.find(b->stream);
  return it == streams_.end() ? nullptr : &it->second;
}

bool BlockPool::unpolled(const Block* b) const {
  const StreamPool* sp = free_owner(b);
  return sp != nullptr && b->free_seq <= sp->unpolled_reach;
}

bool BlockPool::owes(const Block* b) const {
  if (owed_.empty()) return false;
  const StreamPool* sp = free_owner(b);
  return sp != nullptr && b->free_seq <= sp->done;
}

Block* BlockPool::reserve_lazy(std::size_t size, StreamId stream) {
  if (segments_) return try_allocate(size, stream);
  if (size > ctx_.limit) return nullptr;
  settle();
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
  settle();
  return ensure_mapped(b, addr, size, stream);
}

bool BlockPool::backed(const Block* b, DevicePtr addr, std::size_t size) const {
  std::size_t first = 0, last = 0;
  b->arena->covering(addr, size, first, last);
  return b->arena->count_unmapped(first, last) == 0;
}

void BlockPool::poll_stream(StreamPool& sp) {
  sweeps_.poll(sp, [&](std::uint64_t covered) { share_covered(sp, covered); });
}

void BlockPool::share_covered(StreamPool& sp, std::uint64_t covered) {
  while (!sp.fifo.empty() && sp.fifo.front()->free_seq <= covered) make_shared(sp.fifo.front());
  while (!sp.retired.empty() && sp.retired.front()->free_seq <= covered)
    make_shared(sp.retired.front());
}

void BlockPool::record_sweeps() {
  settle();
  // Covers everything each listed stream freed, or has nothing new to cover.
  sweeps_.record_all([&](StreamSweeps::Stream& s) { start_sweep(static_cast<StreamPool&>(s)); });
}

void BlockPool::poll_sweeps() {
  settle();
  sweeps_.poll_all([&](StreamSweeps::Stream& s, std::uint64_t covered) {
    share_covered(static_cast<StreamPool&>(s), covered);
  });
}

void BlockPool::make_shared(Block* b) {
  remove_free(b, /*keep_address=*/true);  // it stays free there
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
  if (!merged_) return;  // only unified placement steals from owned blocks
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

void BlockPool::turn_memory_first() {
  if (!can_turn_memory_first()) return;
  settle();
  turned_ = true;
  ctx_.stats.memory_first = 1;
  mappings_.stop_whole_chunks();
  if (merged_) return;  // placed unified already
  merged_ = true;
  // What unified placement keeps for owned free blocks and own-first did not: an index by
  // address, a place in warm_ (steal() looks there for finished granules), and the stamps
  // that say when their granules are finished (unstamped granules read as finished).
  for (auto& [id, sp] : streams_) {
    for (Block* b = sp.fifo.front(); b != nullptr; b = Fifo::next(b)) {  // oldest freed first
      stamp(b);
      index_address(b);
      if (!Lru::contains(b)) warm_.push_back(b);
    }
    for (Block* b = sp.retired.front(); b != nullptr; b = Fifo::next(b)) stamp(b);
  }
}

void BlockPool::synchronize() {
  // Finish pending sweeps, cover everything freed since, and finish those too.
  for (int round = 0; round < 2; ++round) {
    sweeps_.wait_all();
    poll_sweeps();
    if (round == 0) record_sweeps();
  }
  ++ctx_.stats.num_sync_all_streams;
}

std::size_t BlockPool::release_cached() {
  settle();
  if (segments_) return release_free_segments();
  while (!warm_.empty()) unmap_interior(warm_.front(), SIZE_MAX, Take::kAll);
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
  for (const auto& [id, sp] : streams_) {
    if (!sp.fifo.empty() || !sp.retired.empty()) return released;
  }
  turned_ = false;
  merged_ = unified_by_config();  // whole_chunk_min != 0 here: it turned
  ctx_.stats.memory_first = 0;
  mappings_.resume_whole_chunks();
  return released;
}

std::size_t BlockPool::release_free_segments() {
  std::size_t released = 0;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    Block* b = arena_first_[i];
    Arena& a = *arenas_[i];
    if (b->is_free() && b->shared && b->size == a.size()) {  // the whole segment is free
      remove_free(b);
      delete_block(b);
      mappings_.free_segment(a);
      ctx_.stats.segment[int(Pool::kAll)].decrease(1);
      ctx_.stats.segment[int(Pool::kLarge)].decrease(1);
      released += a.size();
      continue;
    }
    arenas_[kept] = std::move(arenas_[i]);
    arena_first_[kept] = b;
    ++kept;
  }
  arenas_.resize(kept);
  arena_first_.resize(kept);
  mappings_.trim();
  return released;
}

}  // namespace cuarena::detail
