// Arena: one reserved virtual address range and which physical granule is mapped at each of
// its granules.
//
// Invariant kept here: `phys_[g]` names the physical granule mapped at virtual granule g (chunk
// 0 = nothing mapped); bit g of `active_` = phys_[g] valid and not dormant. A mapping is *active*
// (memory of the block there) or *dormant*: still mapped in the driver, but its physical granule
// has moved on to back another address, and may come back here with no driver call once it is idle
// again. The arena records; BlockPool decides and calls the backend.
//
// A *segment* arena (segment backends: cudaMalloc, cudaMallocAsync) is backed whole from birth
// to release: every granule counts as mapped, with no PhysRef, and set/clear are errors.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuarena/types.hpp"

namespace cuarena::detail {

/// One physical granule: granule `offset` of the core's chunk number `chunk` (0: none).
struct PhysRef {
  std::uint32_t chunk = 0;
  std::uint32_t offset = 0;
  bool valid() const { return chunk != 0; }
  bool operator==(const PhysRef&) const = default;
};

class Arena {
 public:
  Arena(DevicePtr base, std::size_t size, std::size_t granule, bool segment = false)
      : base_(base), size_(size), granule_(granule), segment_(segment) {}

  DevicePtr base() const { return base_; }
  std::size_t size() const { return size_; }
  bool segment() const { return segment_; }
  /// One past the highest granule index ever mapped: scans stop here.
  std::size_t high_water() const { return segment_ ? size_ / granule_ : phys_.size(); }

  std::size_t granule_of(DevicePtr addr) const { return (addr - base_) / granule_; }
  DevicePtr granule_addr(std::size_t g) const { return base_ + g * granule_; }

  /// Active: backs whatever block overlaps granule g.
  bool is_mapped(std::size_t g) const {
    return segment_ ? g < size_ / granule_ : g < phys_.size() && (active_[g / 64] >> g % 64 & 1);
  }
  /// The first granule in [first, last) that is not active, or `last` (first <= last). A word of
  /// 64 granules at a time: placement asks this of every candidate block, and most are fully
  /// mapped.
  std::size_t next_inactive(std::size_t first, std::size_t last) const;
  /// Mapped in the driver but not in use here (see above).
  bool is_dormant(std::size_t g) const { return g < phys_.size() && dormant_[g]; }
  /// Mapped in the driver at all (active or dormant).
  bool has_mapping(std::size_t g) const { return g < phys_.size() && phys_[g].valid(); }
  PhysRef phys(std::size_t g) const { return g < phys_.size() ? phys_[g] : PhysRef{}; }
  void set(std::size_t g, PhysRef p);  // new active mapping at an unmapped granule
  void clear(std::size_t g);           // the mapping (active or dormant) is gone
  void set_dormant(std::size_t g, bool dormant);

  /// Who last freed a block over a granule: the stream and its free sequence number then. Seq
  /// 0: known finished (the granule lay wholly inside a shared block since). The granule's
  /// memory may move to another address once that stream's sweeps cover the seq.
  struct FreeStamp {
    StreamId stream = 0;
    std::uint64_t seq = 0;
  };
  void stamp(std::size_t first, std::size_t last, FreeStamp s) {
    // Granules past the table read as finished: a finished stamp there needs no room (a free
    // block may reach to the end of a reservation many times the device).
    if (s.seq == 0) last = std::min(last, stamps_.size());
    if (last > stamps_.size()) stamps_.resize(last);
    for (std::size_t g = first; g < last; ++g) stamps_[g] = s;
  }
  FreeStamp stamp(std::size_t g) const { return g < stamps_.size() ? stamps_[g] : FreeStamp{}; }

  /// Granules [first, last) overlapping byte range [addr, addr+bytes).
  void covering(DevicePtr addr, std::size_t bytes, std::size_t& first, std::size_t& last) const {
    first = granule_of(addr);
    last = (addr + bytes - base_ + granule_ - 1) / granule_;
  }
  /// Granules lying wholly inside [addr, addr+bytes).
  void interior(DevicePtr addr, std::size_t bytes, std::size_t& first, std::size_t& last) const {
    first = (addr - base_ + granule_ - 1) / granule_;
    last = (addr + bytes - base_) / granule_;
    if (last < first) last = first;
  }
  /// Number of unmapped granules in [first, last).
  std::size_t count_unmapped(std::size_t first, std::size_t last) const;

 private:
  void mark_active(std::size_t g, bool active);  // bit g of active_

  DevicePtr base_;
  std::size_t size_;
  std::size_t granule_;
  bool segment_;
  std::vector<PhysRef> phys_;
  std::vector<bool> dormant_;
  std::vector<std::uint64_t> active_;  // bit g: is_mapped(g) (phys_[g] valid and not dormant)
  std::vector<FreeStamp> stamps_;
};

}  // namespace cuarena::detail
