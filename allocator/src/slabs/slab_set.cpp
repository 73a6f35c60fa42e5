#include "slabs/slab_set.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "support/assert.hpp"

namespace cuarena::detail {

SlabSet::~SlabSet() {
  // The pool's destructor unmaps the memory; only host metadata is ours to free.
  while (!all_.empty()) {
    Slab* s = all_.front();
    all_.erase(s);
    delete s;
  }
}

std::vector<SlabSet::ClassState>& SlabSet::stream_classes(StreamId stream) {
  if (last_classes_ != nullptr && stream == last_stream_) return *last_classes_;
  auto& classes = streams_[stream];  // node-based, never erased: the pointer stays valid
  if (classes.empty()) classes.resize(classes_.count());
  last_stream_ = stream;
  last_classes_ = &classes;
  return classes;
}

Slab* SlabSet::new_slab(std::size_t cls, StreamId stream) {
  const std::size_t slot = classes_.size(cls);
  const std::size_t slots =
      std::min(Slab::kMaxSlots, std::max<std::size_t>(1, ctx_.config.slab_size / slot));
  Block* block = pool_.try_allocate(slots * slot, stream);
  if (block == nullptr) return nullptr;
  Slab* s = nullptr;
  if (spare_.empty()) {
    s = new Slab;
  } else {
    s = spare_.back().release();
    spare_.pop_back();
  }
  s->block = block;
  s->stream = stream;
  s->cls = std::uint32_t(cls);
  s->slot_size = slot;
  s->slots = std::uint32_t(slots);
  s->used = s->bumped = 0;
  s->freed.clear();  // keeps its capacity
  all_.push_back(s);
  slab_bytes_ += block->size;
  ++ctx_.stats.slabs_created;
  ctx_.stats.segment[int(Pool::kAll)].increase(1);
  ctx_.stats.segment[int(Pool::kSmall)].increase(1);
  // The slab's bytes move from the large pool's reserved figure to the small pool's.
  ctx_.stats.reserved_bytes[int(Pool::kLarge)].decrease(std::int64_t(block->size));
  ctx_.stats.reserved_bytes[int(Pool::kSmall)].increase(std::int64_t(block->size));
  return s;
}

void SlabSet::release(Slab* s) {
  ctx_.stats.reserved_bytes[int(Pool::kSmall)].decrease(std::int64_t(s->block->size));
  ctx_.stats.reserved_bytes[int(Pool::kLarge)].increase(std::int64_t(s->block->size));
  ctx_.stats.segment[int(Pool::kAll)].decrease(1);
  ctx_.stats.segment[int(Pool::kSmall)].decrease(1);
  ++ctx_.stats.slabs_released;
  slab_bytes_ -= s->block->size;
  all_.erase(s);
  pool_.deallocate(s->block);
  s->block = nullptr;
  spare_.emplace_back(s);
}

DevicePtr SlabSet::allocate(std::size_t cls, StreamId stream, Slab*& slab) {
  ClassState& cs = stream_classes(stream)[cls];
  Slab* s = nullptr;
  if (!cs.partial.empty()) {
    s = *cs.partial.begin();
  } else {
    s = new_slab(cls, stream);
    if (s == nullptr) return 0;
    cs.partial.insert(s);
  }
  std::uint32_t slot;
  if (!s->freed.empty()) {
    slot = s->freed.back();
    s->freed.pop_back();
  } else {
    slot = s->bumped++;
  }
  if (++s->used == s->slots) cs.partial.erase(s);
  slab = s;
  return s->base() + DevicePtr(slot) * s->slot_size;
}

void SlabSet::deallocate(Slab* s, DevicePtr ptr) {
  ClassState& cs = stream_classes(s->stream)[s->cls];
  const auto slot = std::uint32_t((ptr - s->base()) / s->slot_size);
  const bool was_full = s->used == s->slots;
  s->freed.push_back(slot);
  --s->used;
  if (s->used == 0) {
    // Empty: its block goes back to the pool at once, where any size can reuse the memory
    // (caching one empty slab per class raised peak memory: docs/results.md).
    if (!was_full) cs.partial.erase(s);
    release(s);
    return;
  }
  if (was_full) cs.partial.insert(s);
}

void SlabSet::free_extents(std::size_t& total, std::size_t& largest) const {
  total = largest = 0;
  std::vector<std::uint8_t> in_use;
  auto visit = [&](const Slab* s) {
    in_use.assign(s->slots, 0);
    for (std::uint32_t i = 0; i < s->bumped; ++i) in_use[i] = 1;
    for (std::uint32_t i : s->freed) in_use[i] = 0;
    std::size_t run = 0;
    for (std::uint32_t i = 0; i < s->slots; ++i) {
      if (in_use[i]) {
        run = 0;
      } else {
        run += s->slot_size;
        total += s->slot_size;
        largest = std::max(largest, run);
      }
    }
  };
  for (const auto& [stream, classes] : streams_) {
    for (const ClassState& cs : classes) {
      for (const Slab* s : cs.partial) visit(s);
    }
  }
}

void SlabSet::check_invariants() const {
  for (const auto& [stream, classes] : streams_) {
    for (std::size_t c = 0; c < classes.size(); ++c) {
      const ClassState& cs = classes[c];
      for (const Slab* s : cs.partial) {
        const std::string at = "slab at " + std::to_string(s->base());
        CUARENA_CHECK(s->stream == stream && s->cls == c, at + ": filed wrongly");
        CUARENA_CHECK(s->block->allocated, at + ": its block is not allocated");
        CUARENA_CHECK(s->used + s->freed.size() == s->bumped && s->bumped <= s->slots,
                      at + ": slot counts disagree");
        CUARENA_CHECK(s->used != 0 && s->used != s->slots,
                      at + ": in the partial list but empty or full");
      }
    }
  }
}

}  // namespace cuarena::detail
