// SlabSet: small requests from size-class slabs.
//
// A slab is one allocated BlockPool block of `per_slab` equal slots of one size class, owned by
// one stream (slots freed there are reused there at once, in stream order). Slot metadata lives
// on the host: device memory is never touched. Untouched slots are handed out by a bump index,
// freed ones from a LIFO stack, so making a slab costs O(1) whatever its slot count.
//
// Invariants kept here: every live slab has at least one slot in use (a slab that empties returns
// its block to the pool at once, so small and large requests share physical memory); a slab is in
// its class's `partial` set iff it also has a free slot; `all_` lists every live slab.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "cuarena/size_classes.hpp"
#include "large/block_pool.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

struct Slab {
  Block* block = nullptr;
  StreamId stream = 0;
  std::uint32_t cls = 0;
  std::size_t slot_size = 0;         ///< bytes
  std::uint32_t slots = 0;           ///< at most kMaxSlots
  std::uint32_t used = 0;            ///< slots currently allocated
  std::uint32_t bumped = 0;          ///< slots [0, bumped) have been handed out at least once
  std::vector<std::uint32_t> freed;  ///< freed slot indices below `bumped`
  static constexpr std::size_t kMaxSlots = tuning::kMaxSlabSlots;
  Link<Slab> all;  ///< SlabSet::all_
  DevicePtr base() const { return block->addr; }
};

struct ByAddress {
  bool operator()(const Slab* a, const Slab* b) const { return a->base() < b->base(); }
};

class SlabSet {
 public:
  SlabSet(Context& ctx, BlockPool& pool, const SizeClasses& classes)
      : ctx_(ctx), pool_(pool), classes_(classes) {}
  ~SlabSet();
  SlabSet(const SlabSet&) = delete;
  SlabSet& operator=(const SlabSet&) = delete;

  /// A slot of class `cls` for `stream`; nullptr when a new slab cannot be had (pool refused).
  DevicePtr allocate(std::size_t cls, StreamId stream, Slab*& slab);
  /// Returns a slot to its slab (on the slab's stream).
  void deallocate(Slab* slab, DevicePtr ptr);

  /// Bytes in free slots of live slabs, and the largest run of them (contiguous free slots).
  void free_extents(std::size_t& total, std::size_t& largest) const;
  std::size_t slab_bytes() const { return slab_bytes_; }
  void check_invariants() const;

 private:
  struct ClassState {
    std::set<Slab*, ByAddress> partial;  // lowest address first: keeps high slabs emptying
  };
  std::vector<ClassState>& stream_classes(StreamId stream);
  Slab* new_slab(std::size_t cls, StreamId stream);
  void release(Slab* slab);

  Context& ctx_;
  BlockPool& pool_;
  const SizeClasses& classes_;
  std::unordered_map<StreamId, std::vector<ClassState>> streams_;
  StreamId last_stream_ = 0;  // stream_classes()'s one-entry cache
  std::vector<ClassState>* last_classes_ = nullptr;
  IntrusiveList<Slab, &Slab::all> all_;  // every live slab, full ones included
  // Released slabs' host records, reused by new_slab(): a lone small block empties and remakes
  // its slab on every allocate/free pair, and this keeps that pair off the heap (the record and
  // its freed-slot vector). Bounded by the most slabs ever live at once.
  std::vector<std::unique_ptr<Slab>> spare_;
  std::size_t slab_bytes_ = 0;
};

}  // namespace cuarena::detail
