#include "private_pool.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuarena/segment_size.hpp"
#include "support/assert.hpp"

namespace cuarena {

namespace {
// A caller broke allocate_at()'s contract (not an invariant of the pool: it is left unchanged).
[[noreturn]] void misused(const std::string& what) {
  throw std::logic_error("cuarena PrivatePool: " + what);
}

std::string hex(DevicePtr p) {
  char buf[2 + 16 + 1];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

DevicePtr to_addr(const void* p) { return reinterpret_cast<DevicePtr>(p); }
}  // namespace

PrivatePool::PrivatePool(Upstream upstream, Options options)
    : upstream_(std::move(upstream)), options_(options) {
  const Options& o = options_;
  if (o.granule == 0 || o.granule % kMinBlockSize != 0 || o.medium_segment % kMinBlockSize != 0 ||
      o.small_limit > o.granule || o.medium_limit > o.medium_segment) {
    throw ConfigError(
        "PrivatePool: granule and medium_segment must be non-zero multiples of 512, "
        "small_limit <= granule and medium_limit <= medium_segment");
  }
}

PrivatePool::~PrivatePool() {
  for (const auto& [base, seg] : segments_) {
    try {
      upstream_.deallocate(base, seg.size);
    } catch (...) {  // a destructor must not throw; the memory is lost to the pool either way
    }
  }
}

std::size_t PrivatePool::segment_size(std::size_t size) const {
  const Options& o = options_;
  if (o.no_split) return round_up(size, o.granule);
  return cuarena::segment_size(
      size, {o.small_limit, o.granule, o.medium_limit, o.medium_segment, o.granule});
}

void* PrivatePool::allocate(std::size_t bytes, StreamId stream) {
  if (bytes == 0) return nullptr;
  if (bytes > std::numeric_limits<std::size_t>::max() / 2) {  // round_up would overflow
    throw OutOfMemoryError("PrivatePool: request of " + std::to_string(bytes) + " bytes", bytes);
  }
  const std::size_t size = round_up(bytes, kMinBlockSize);
  auto it = best_fit(size, stream);
  if (it == blocks_.end()) it = new_segment(bytes, stream);
  unindex(it);
  if (!options_.no_split && it->second.size > size) index(split(it, size));
  occupy(it, bytes, stream);
  return reinterpret_cast<void*>(it->first);
}

// The smaller (size, address) of the best fits among `stream`'s own free blocks and the shared
// ones.
PrivatePool::Blocks::iterator PrivatePool::best_fit(std::size_t size, StreamId stream) {
  const std::pair<std::size_t, DevicePtr> key{size, 0};
  auto best = shared_.lower_bound(key);
  if (auto own = owned_.find(stream); own != owned_.end()) {
    auto mine = own->second.lower_bound(key);
    if (mine != own->second.end() && (best == shared_.end() || *mine < *best)) {
      return blocks_.find(mine->second);
    }
  }
  return best == shared_.end() ? blocks_.end() : blocks_.find(best->second);
}

// A new segment for a request of `requested` bytes, as one free block owned by `stream`
// (indexed).
PrivatePool::Blocks::iterator PrivatePool::new_segment(std::size_t requested, StreamId stream) {
  const std::size_t bytes = segment_size(round_up(requested, kMinBlockSize));
  const DevicePtr base = upstream_.allocate(bytes);
  if (base == 0) {
    throw OutOfMemoryError("PrivatePool: upstream refused a segment of " + std::to_string(bytes) +
                               " bytes for a request of " + std::to_string(requested) + " bytes",
                           requested);
  }
  try {
    segments_.emplace(base, Segment{bytes, stream, 0});
    auto it = blocks_.emplace(base, Block{bytes, 0, base, stream, false, false}).first;
    index(it);
    reserved_ += bytes;
    return it;
  } catch (...) {  // std::bad_alloc: give the segment back rather than leak it
    if (auto b = blocks_.find(base); b != blocks_.end()) {
      unindex(b);
      blocks_.erase(b);
    }
    segments_.erase(base);
    upstream_.deallocate(base, bytes);
    throw;
  }
}

// Cuts the unindexed free block `it` to `size` bytes; returns the remainder, a free block with
// the same owner, unindexed.
PrivatePool::Blocks::iterator PrivatePool::split(Blocks::iterator it, std::size_t size) {
  Block rest = it->second;
  rest.size -= size;
  it->second.size = size;
  return blocks_.emplace_hint(std::next(it), it->first + size, rest);
}

// Makes the unindexed free block `it` live.
void PrivatePool::occupy(Blocks::iterator it, std::size_t requested, StreamId stream) {
  Block& b = it->second;
  b.allocated = true;
  b.shared = false;
  b.stream = stream;
  b.requested = requested;
  ++segments_.at(b.segment).live;
  allocated_ += b.size;
  requested_ += requested;
  ++live_;
}

void PrivatePool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  auto it = blocks_.find(to_addr(ptr));
  if (it == blocks_.end() || !it->second.allocated) {
    throw InvalidPointerError("PrivatePool: " + hex(to_addr(ptr)) + " is not a live block here");
  }
  Block& b = it->second;
  b.allocated = false;  // owned by b.stream, its allocation stream
  --segments_.at(b.segment).live;
  allocated_ -= b.size;
  requested_ -= b.requested;
  b.requested = 0;
  --live_;
  coalesce_and_index(it);
}

// Merges the unindexed free block `it` with its free neighbours of the same owner in its
// segment (they leave their index), then indexes the result.
void PrivatePool::coalesce_and_index(Blocks::iterator it) {
  auto mergeable = [&](Blocks::iterator n) {
    return !n->second.allocated && n->second.segment == it->second.segment &&
           same_owner(n->second, it->second);
  };
  if (auto next = std::next(it); next != blocks_.end() && mergeable(next)) {
    unindex(next);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    if (auto prev = std::prev(it); mergeable(prev)) {
      unindex(prev);
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  index(it);
}

// Rebuilds the free indexes in one address-ordered pass: every free block becomes shared and
// absorbs the free blocks after it in its segment. O(blocks); called rarely (after a sync).
void PrivatePool::share_free_blocks() {
  owned_.clear();
  shared_.clear();
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    Block& b = it->second;
    if (b.allocated) continue;
    b.shared = true;
    for (auto next = std::next(it);
         next != blocks_.end() && !next->second.allocated && next->second.segment == b.segment;) {
      b.size += next->second.size;
      next = blocks_.erase(next);
    }
    index(it);
  }
}

void PrivatePool::allocate_at(DevicePtr ptr, std::size_t bytes, std::size_t requested,
                              StreamId stream) {
  const std::string range = "[" + hex(ptr) + ", +" + std::to_string(bytes) + ")";
  if (ptr == 0 || bytes == 0 || ptr % kMinBlockSize != 0 || bytes % kMinBlockSize != 0 ||
      requested > bytes) {
    misused("allocate_at " + range + " with requested " + std::to_string(requested) +
            ": needs non-zero multiples of 512 and requested <= bytes");
  }
  auto it = blocks_.upper_bound(ptr);
  if (it == blocks_.begin()) misused("allocate_at " + range + " is outside every segment");
  --it;
  const Block& b = it->second;
  if (b.allocated || ptr - it->first > b.size || bytes > b.size - (ptr - it->first)) {
    misused("allocate_at " + range + " is not inside one free block");
  }
  unindex(it);
  if (ptr > it->first) {
    auto rest = split(it, ptr - it->first);
    index(it);
    it = rest;
  }
  if (it->second.size > bytes) index(split(it, bytes));
  occupy(it, requested, stream);
}

std::size_t PrivatePool::release_free_segments() {
  std::size_t released = 0;
  for (auto s = segments_.begin(); s != segments_.end();) {
    const auto [base, seg] = *s;
    if (seg.live != 0) {
      ++s;
      continue;
    }
    upstream_.deallocate(base, seg.size);  // first: if it throws, the pool is unchanged
    for (auto it = blocks_.find(base); it != blocks_.end() && it->second.segment == base;) {
      unindex(it);
      it = blocks_.erase(it);
    }
    reserved_ -= seg.size;
    released += seg.size;
    s = segments_.erase(s);
  }
  return released;
}

bool PrivatePool::owns(const void* ptr) const {
  const DevicePtr a = to_addr(ptr);
  auto s = segments_.upper_bound(a);
  if (s == segments_.begin()) return false;
  --s;
  return a - s->first < s->second.size;
}

bool PrivatePool::is_live(const void* ptr) const { return block_size(ptr) != 0; }

std::size_t PrivatePool::block_size(const void* ptr) const {
  auto it = blocks_.find(to_addr(ptr));
  return it != blocks_.end() && it->second.allocated ? it->second.size : 0;
}

std::size_t PrivatePool::largest_free_block() const {
  std::size_t largest = shared_.empty() ? 0 : shared_.rbegin()->first;
  for (const auto& [stream, set] : owned_) {
    if (!set.empty()) largest = std::max(largest, set.rbegin()->first);
  }
  return largest;
}

std::vector<PrivatePool::SegmentView> PrivatePool::segments() const {
  std::vector<SegmentView> out;
  for (const auto& [base, seg] : segments_) out.push_back({base, seg.size, seg.stream, {}});
  auto view = out.begin();
  for (const auto& [addr, b] : blocks_) {  // both maps are in address order
    while (view->addr != b.segment) ++view;
    view->blocks.push_back({addr, b.size, b.requested, b.allocated});
  }
  return out;
}

std::vector<PrivatePool::LiveBlock> PrivatePool::live() const {
  std::vector<LiveBlock> out;
  out.reserve(live_);
  for (const auto& [addr, b] : blocks_) {
    if (b.allocated) out.push_back({addr, b.size, b.requested, b.stream});
  }
  return out;
}

void PrivatePool::check_invariants() const {
  auto in_index = [&](const Block& b, DevicePtr addr) {
    if (b.shared) return shared_.count({b.size, addr}) == 1;
    auto own = owned_.find(b.stream);
    return own != owned_.end() && own->second.count({b.size, addr}) == 1;
  };
  std::size_t reserved = 0, allocated = 0, requested = 0, live = 0, free = 0;
  DevicePtr previous_end = 0;
  auto it = blocks_.begin();
  for (const auto& [base, seg] : segments_) {
    CUARENA_CHECK(base >= previous_end,
                  "PrivatePool: segment " + hex(base) + " overlaps the one below it");
    CUARENA_CHECK(seg.size != 0, "PrivatePool: segment " + hex(base) + " is empty");
    previous_end = base + seg.size;
    reserved += seg.size;
    DevicePtr cursor = base;
    std::size_t seg_live = 0;
    const Block* prev = nullptr;
    for (; it != blocks_.end() && it->second.segment == base; ++it) {
      const auto& [addr, b] = *it;
      CUARENA_CHECK(addr == cursor,
                    "PrivatePool: block " + hex(addr) + " does not start where its neighbour ends");
      CUARENA_CHECK(b.size != 0 && b.size % kMinBlockSize == 0,
                    "PrivatePool: block " + hex(addr) + " has a bad size");
      cursor += b.size;
      if (b.allocated) {
        CUARENA_CHECK(b.requested <= b.size,
                      "PrivatePool: block " + hex(addr) + " requested more than its size");
        ++seg_live;
        allocated += b.size;
        requested += b.requested;
      } else {
        ++free;
        CUARENA_CHECK(in_index(b, addr), "PrivatePool: free block " + hex(addr) +
                                             " is missing from its owner's index");
        CUARENA_CHECK(
            prev == nullptr || prev->allocated || !same_owner(*prev, b),
            "PrivatePool: free block " + hex(addr) + " was not coalesced with its free neighbour");
      }
      prev = &b;
    }
    CUARENA_CHECK(cursor == previous_end, "PrivatePool: blocks do not tile segment " + hex(base));
    CUARENA_CHECK(seg_live == seg.live,
                  "PrivatePool: segment " + hex(base) + " miscounts its live blocks");
    live += seg_live;
  }
  CUARENA_CHECK(it == blocks_.end(),
                "PrivatePool: block " + hex(it->first) + " lies outside its segment");
  std::size_t indexed = shared_.size();
  for (const auto& [stream, set] : owned_) indexed += set.size();
  CUARENA_CHECK(indexed == free, "PrivatePool: the free indexes hold blocks that are not free");
  CUARENA_CHECK(reserved == reserved_,
                "PrivatePool: reserved_bytes differs from the sum of segment sizes");
  CUARENA_CHECK(allocated == allocated_,
                "PrivatePool: allocated_bytes differs from the sum of live blocks");
  CUARENA_CHECK(requested == requested_,
                "PrivatePool: requested_bytes differs from the sum of live requests");
  CUARENA_CHECK(live == live_, "PrivatePool: live_blocks differs from the count of live blocks");
}

}  // namespace cuarena
