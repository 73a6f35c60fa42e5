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

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cuarena/types.hpp"
#include "spin_lock.hpp"

namespace cuarena::detail {

struct Block;
struct Slab;

/// One live allocation.
struct LiveBlock {
  std::size_t requested = 0;     ///< bytes asked for
  std::size_t size = 0;          ///< bytes reserved for it (class size or 512-byte multiple)
  StreamId stream = 0;           ///< allocation stream
  Slab* slab = nullptr;          ///< small: its slab
  Block* block = nullptr;        ///< large: its pool block
  std::vector<StreamId> uses;    ///< other streams, from record_stream()
};

class LiveTable {
 public:
  static constexpr std::size_t kStripes = 256;

  void insert(DevicePtr ptr, LiveBlock&& rec) {
    Stripe& s = stripe(ptr);
    std::lock_guard lock(s.mu);
    s.map.emplace(ptr, std::move(rec));
  }

  /// Removes and returns the record of `ptr`, or nothing when it is not live.
  std::optional<LiveBlock> take(DevicePtr ptr) {
    Stripe& s = stripe(ptr);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(ptr);
    if (it == s.map.end()) return std::nullopt;
    std::optional<LiveBlock> out(std::move(it->second));
    s.map.erase(it);
    return out;
  }

  /// Calls fn(LiveBlock&) on the record of `ptr` under its stripe's lock; false when not live.
  template <class Fn>
  bool update(DevicePtr ptr, Fn&& fn) {
    Stripe& s = stripe(ptr);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(ptr);
    if (it == s.map.end()) return false;
    fn(it->second);
    return true;
  }

  bool contains(DevicePtr ptr) const {
    const Stripe& s = stripes_[index(ptr)];
    std::lock_guard lock(s.mu);
    return s.map.count(ptr) != 0;
  }

  /// Calls fn(ptr, const LiveBlock&) on every record, one stripe locked at a time.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Stripe& s : stripes_) {
      std::lock_guard lock(s.mu);
      for (const auto& [ptr, rec] : s.map) fn(ptr, rec);
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
  struct alignas(64) Stripe {  // one cache line each: stripes do not share lines
    mutable SpinLock mu;
    std::unordered_map<DevicePtr, LiveBlock> map;
  };
  // Fibonacci hashing of the 512-byte block index: neighbouring blocks land apart.
  static std::size_t index(DevicePtr ptr) {
    return std::size_t((std::uint64_t(ptr >> 9) * 0x9E3779B97F4A7C15ull) >> 56);
  }
  Stripe& stripe(DevicePtr ptr) { return stripes_[index(ptr)]; }
  static_assert(kStripes == 256, "index() takes the top 8 bits");

  std::array<Stripe, kStripes> stripes_;
};

}  // namespace cuarena::detail
