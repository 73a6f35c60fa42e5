// Arena: one reserved virtual address range and which of its granules are mapped.
//
// Invariant kept here: `mapped_` has bit g set iff granule g of the range is mapped through the
// backend; `mapped_count_` is the number of set bits. The arena never maps or unmaps by itself:
// BlockPool decides, the arena records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuarena/types.hpp"

namespace cuarena::detail {

class Arena {
 public:
  Arena(DevicePtr base, std::size_t size, std::size_t granule)
      : base_(base), size_(size), granule_(granule) {}

  DevicePtr base() const { return base_; }
  std::size_t size() const { return size_; }
  std::size_t granule() const { return granule_; }
  std::size_t mapped_count() const { return mapped_count_; }
  /// One past the highest granule index ever mapped: scans stop here.
  std::size_t high_water() const { return bits_.size() * 64; }

  /// Granule index holding byte `addr` (addr in [base, base+size]).
  std::size_t granule_of(DevicePtr addr) const { return (addr - base_) / granule_; }
  DevicePtr granule_addr(std::size_t g) const { return base_ + g * granule_; }

  bool is_mapped(std::size_t g) const {
    return g / 64 < bits_.size() && (bits_[g / 64] >> (g % 64) & 1u);
  }
  void set_mapped(std::size_t first, std::size_t count, bool mapped);

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
  DevicePtr base_;
  std::size_t size_;
  std::size_t granule_;
  std::vector<std::uint64_t> bits_;
  std::size_t mapped_count_ = 0;
};

}  // namespace cuarena::detail
