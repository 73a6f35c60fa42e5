// LiveTable: the allocations handed out and not yet freed, by address.
//
// Striped: each of kStripes hash maps has its own lock, so threads freeing different blocks
// rarely meet, and the stream caches' fast path (stream_cache.hpp) never takes the device lock.
// A stripe's lock is a leaf lock (nothing else is taken while it is held) and a spin lock: it is
// held for one hash-map operation, far shorter than a futex sleep and wake-up.
//
// Invariant kept here: a pointer is in at most one stripe (the one its address hashes to), and
// only while it is a live allocation.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "cuarena/types.hpp"
#include "support/spin_lock.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

struct Block;
struct Slab;

/// One live allocation.
struct LiveBlock {
  std::size_t requested = 0;       ///< bytes asked for
  std::size_t size = 0;            ///< bytes reserved for it (class size or 512-byte multiple)
  StreamId stream = 0;             ///< allocation stream
  Slab* slab = nullptr;            ///< small: its slab
  Block* block = nullptr;          ///< large: its pool block
  std::vector<StreamId> uses;      ///< other streams, from record_stream()
  std::uint64_t seq = UINT64_MAX;  ///< its number in the loop planner (if it saw it)
  bool planned = false;            ///< served by the planned arena (slab and block null)
};

class LiveTable {
 public:
  static constexpr std::size_t kStripes = tuning::kLiveTableStripes;

  void insert(DevicePtr ptr, LiveBlock&& rec) {
    Stripe& s = stripe(ptr);
    std::lock_guard lock(s.mu);
    s.map.insert(ptr, hash(ptr), std::move(rec));
  }

  /// Removes and returns the record of `ptr`, or nothing when it is not live.
  std::optional<LiveBlock> take(DevicePtr ptr) {
    Stripe& s = stripe(ptr);
    std::lock_guard lock(s.mu);
    return s.map.take(ptr, hash(ptr));
  }

  /// Calls fn(LiveBlock&) on the record of `ptr` under its stripe's lock; false when not live.
  template <class Fn>
  bool update(DevicePtr ptr, Fn&& fn) {
    Stripe& s = stripe(ptr);
    std::lock_guard lock(s.mu);
    LiveBlock* rec = s.map.find(ptr, hash(ptr));
    if (rec == nullptr) return false;
    fn(*rec);
    return true;
  }

  bool contains(DevicePtr ptr) const {
    const Stripe& s = stripes_[index(ptr)];
    std::lock_guard lock(s.mu);
    return const_cast<Map&>(s.map).find(ptr, hash(ptr)) != nullptr;
  }

  /// Calls fn(ptr, const LiveBlock&) on every record, one stripe locked at a time.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Stripe& s : stripes_) {
      std::lock_guard lock(s.mu);
      s.map.for_each(fn);
    }
  }

  std::size_t size() const {
    std::size_t n = 0;
    for (const Stripe& s : stripes_) {
      std::lock_guard lock(s.mu);
      n += s.map.size();
    }
    return n;
  }

 private:
  // Open addressing with linear probing: no allocation per insert (a node-based map's malloc
  // and free were most of the table's cost). Keys 0 and 1 mark empty and erased slots; live
  // pointers are non-null multiples of 512. Grows (and drops erased slots) at 1/2 occupancy.
  class Map {
   public:
    void insert(DevicePtr key, std::uint64_t h, LiveBlock&& value) {
      if (2 * (used_ + 1) > slots_.size()) rehash(std::max<std::size_t>(16, 2 * (size_ + 1) * 2));
      for (std::size_t i = home(h);; i = (i + 1) & mask()) {
        Slot& slot = slots_[i];
        if (slot.key == kEmpty || slot.key == kErased) {
          used_ += slot.key == kEmpty;
          slot.key = key;
          slot.value = std::move(value);
          ++size_;
          return;
        }
      }
    }
    LiveBlock* find(DevicePtr key, std::uint64_t h) {
      Slot* slot = find_slot(key, h);
      return slot ? &slot->value : nullptr;
    }
    std::optional<LiveBlock> take(DevicePtr key, std::uint64_t h) {
      Slot* slot = find_slot(key, h);
      if (slot == nullptr) return std::nullopt;
      std::optional<LiveBlock> out(std::move(slot->value));
      slot->value = LiveBlock{};
      slot->key = kErased;  // keeps later keys of the probe run reachable
      --size_;
      return out;
    }
    template <class Fn>
    void for_each(Fn& fn) const {
      for (const Slot& slot : slots_) {
        if (slot.key != kEmpty && slot.key != kErased) fn(slot.key, slot.value);
      }
    }
    std::size_t size() const { return size_; }

   private:
    static constexpr DevicePtr kEmpty = 0, kErased = 1;
    struct Slot {
      DevicePtr key = kEmpty;
      LiveBlock value;
    };
    std::size_t mask() const { return slots_.size() - 1; }
    // Bits 24-55 of the hash (the top 8 pick the stripe; the low ones are zero for aligned
    // pointers, since a Fibonacci product's low bits depend only on the key's low bits).
    std::size_t home(std::uint64_t h) const { return std::size_t(h >> 24) & mask(); }
    Slot* find_slot(DevicePtr key, std::uint64_t h) {
      if (slots_.empty() || key <= kErased) return nullptr;  // the markers are never live
      for (std::size_t i = home(h);; i = (i + 1) & mask()) {
        Slot& slot = slots_[i];
        if (slot.key == key) return &slot;
        if (slot.key == kEmpty) return nullptr;
      }
    }
    void rehash(std::size_t capacity) {  // a power of two
      std::size_t n = 16;
      while (n < capacity) n *= 2;
      std::vector<Slot> old(n);
      old.swap(slots_);
      used_ = size_ = 0;
      for (Slot& slot : old) {
        if (slot.key != kEmpty && slot.key != kErased)
          insert(slot.key, hash(slot.key), std::move(slot.value));
      }
    }
    std::vector<Slot> slots_;  // size a power of two, or empty
    std::size_t size_ = 0;     // live keys
    std::size_t used_ = 0;     // live or erased slots
  };

  struct alignas(64) Stripe {  // one cache line each: stripes do not share lines
    mutable SpinLock mu;
    Map map;
  };
  // Fibonacci hashing of the 512-byte block index: neighbouring blocks land apart. The top 8
  // bits pick the stripe, the low bits the slot.
  static std::uint64_t hash(DevicePtr ptr) {
    return std::uint64_t(ptr >> 9) * 0x9E3779B97F4A7C15ull;
  }
  static std::size_t index(DevicePtr ptr) { return std::size_t(hash(ptr) >> 56); }
  Stripe& stripe(DevicePtr ptr) { return stripes_[index(ptr)]; }
  static_assert(kStripes == 256, "index() takes the top 8 bits");

  std::array<Stripe, kStripes> stripes_;
};

}  // namespace cuarena::detail
