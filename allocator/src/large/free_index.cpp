#include "large/free_index.hpp"

#include <algorithm>
#include <string>

namespace cuarena::detail {

Block* FreeIndex::tile(Arena& a) {
  Block* b = new_block();
  b->addr = a.base();
  b->size = a.size();
  b->arena = &a;
  b->shared = true;
  firsts_.push_back(b);
  insert(b, nullptr, /*warm=*/false);
  return b;
}

Block* FreeIndex::split_off(Block* b, DevicePtr at) {
  CUARENA_ASSERT_INTERNAL(at > b->addr && at < b->end(), "split_off: the cut must lie inside");
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

void FreeIndex::absorb(Block* lower, Block* upper) {
  // Tiling: the merged block covers exactly what the two did.
  CUARENA_ASSERT_INTERNAL(lower->next == upper && upper->prev == lower &&
                              lower->end() == upper->addr && lower->arena == upper->arena,
                          "absorb: the blocks must be neighbours in one arena");
  CUARENA_ASSERT_INTERNAL(!upper->addressed && !upper->fifo.linked && !upper->lru.linked,
                          "absorb: the upper block must be out of every index");
  lower->size += upper->size;
  lower->next = upper->next;
  if (upper->next) upper->next->prev = lower;
  lower->free_seq = std::max(lower->free_seq, upper->free_seq);
  lower->used = lower->used || upper->used;
  lower->lazy = lower->lazy || upper->lazy;
  delete_block(upper);
}

void FreeIndex::index_address(Block* b) {
  if (!addressable(b)) {
    unaddress(b);
  } else if (!b->addressed) {
    free_by_addr_.emplace(b->addr, b);
    b->addressed = true;
  }
}

void FreeIndex::insert(Block* b, Block* fifo_pos, bool warm) {
  CUARENA_ASSERT_INTERNAL(!b->allocated && !b->fifo.linked && !b->lru.linked,
                          "insert: the block must be free and detached");
  index_address(b);
  if (b->shared) {
    ++free_blocks_;
    shared_free_.insert(b);
    if (warm && !b->arena->segment()) warm_.insert_before(warm_before_, b);  // segments never unmap
    return;
  }
  StreamFreeLists& sp = stream(b->stream);
  if (b->retired) {
    CUARENA_ASSERT_INTERNAL(sp.retired.empty() || sp.retired.back()->free_seq <= b->free_seq,
                            "insert: a retired block must be its stream's newest");
    sp.retired.push_back(b);  // newest free_seq: keeps the list sorted
    return;
  }
  ++free_blocks_;
  sp.free.insert(b);
  sp.fifo.insert_before(fifo_pos, b);
  // Placed unified, it may hold finished granules (of a shared block it absorbed): defragmentation
  // looks.
  if (unified_ && warm) warm_.insert_before(warm_before_, b);
}

void FreeIndex::reinsert(Block* b) {
  Block* pos = nullptr;
  if (!b->shared && !b->retired) {
    pos = stream(b->stream).fifo.front();
    while (pos != nullptr && pos->free_seq <= b->free_seq) pos = Fifo::next(pos);
  }
  insert(b, pos);
}

void FreeIndex::remove(Block* b, bool keep_address) {
  if (!keep_address) unaddress(b);
  if (b->shared) {
    CUARENA_ASSERT_INTERNAL(free_blocks_ > 0, "remove: no free block is counted");
    --free_blocks_;
    shared_free_.erase(b);
    if (Lru::contains(b)) warm_.erase(b);
    return;
  }
  StreamFreeLists& sp = stream(b->stream);
  if (b->retired) {
    sp.retired.erase(b);
    return;
  }
  CUARENA_ASSERT_INTERNAL(free_blocks_ > 0, "remove: no free block is counted");
  --free_blocks_;
  sp.free.erase(b);
  sp.fifo.erase(b);
  if (Lru::contains(b)) warm_.erase(b);
}

void FreeIndex::check_invariants(const Block* detached) const {
  std::size_t free_seen = 0, addressed = 0;
  for (const Block* first : firsts_) {
    const Arena& a = *first->arena;
    DevicePtr expect = a.base();
    const Block* prev = nullptr;
    for (const Block* b = first; b != nullptr; prev = b, b = b->next) {
      const std::string at = "block at " + std::to_string(b->addr);
      CUARENA_CHECK(b->addr == expect, at + ": blocks do not tile the arena");
      CUARENA_CHECK(b->prev == prev && b->arena == &a, at + ": neighbour links are wrong");
      CUARENA_CHECK(b->size != 0 && b->size % kMinBlockSize == 0, at + ": size not a 512 multiple");
      expect += b->size;
      if (b == detached) {
        addressed += b->addressed;
        continue;
      }
      CUARENA_CHECK(b->addressed == addressable(b), at + ": in the address index iff addressable");
      if (b->addressed) {
        ++addressed;
        const auto e = free_by_addr_.find(b->addr);
        CUARENA_CHECK(e != free_by_addr_.end() && e->second == b, at + ": address entry wrong");
      }
      if (b->allocated) {
        CUARENA_CHECK(!b->fifo.linked && !b->lru.linked, at + ": allocated block is indexed");
        continue;
      }
      if (b->retired) {
        CUARENA_CHECK(b->fifo.linked && !b->shared, at + ": retired block not in its list");
        continue;
      }
      ++free_seen;
      if (b->shared) {
        CUARENA_CHECK(shared_free_.count(const_cast<Block*>(b)) && !b->fifo.linked,
                      at + ": shared block not in the shared index");
      } else {
        const StreamFreeLists* sp = find_stream(b->stream);
        CUARENA_CHECK(sp != nullptr && sp->free.count(const_cast<Block*>(b)) && b->fifo.linked &&
                          (!b->lru.linked || unified_),
                      at + ": owned block not in its stream's index");
      }
    }
    CUARENA_CHECK(expect == a.base() + a.size(), "blocks do not cover the whole arena");
  }
  std::size_t indexed = shared_free_.size();
  for (const auto& [id, sp] : streams_) {
    indexed += sp.free.size();
    // Mid-operation (a detached block) the order may lag: a request that failed puts its
    // owned block back at the FIFO's back with its old free number until the retry shares it.
    if (detached != nullptr) continue;
    for (const Fifo* list : {&sp.fifo, &sp.retired}) {
      std::uint64_t last_seq = 0;
      for (const Block* b = list->front(); b != nullptr; b = Fifo::next(b)) {
        CUARENA_CHECK(b->free_seq >= last_seq, "stream FIFO not in free order");
        CUARENA_CHECK(b->stream == id, "block in another stream's FIFO");
        CUARENA_CHECK(b->retired == (list == &sp.retired), "block in the wrong stream list");
        last_seq = b->free_seq;
      }
    }
  }
  // (A detached block is out of the count and the indexes already.)
  CUARENA_CHECK(free_seen == free_blocks_ && indexed == free_blocks_, "free block count mismatch");
  CUARENA_CHECK(addressed == free_by_addr_.size(), "address index holds blocks that are gone");
}

}  // namespace cuarena::detail
