#include "arena.hpp"

#include <bit>

#include "assert.hpp"

namespace cuarena::detail {

void Arena::set(std::size_t g, PhysRef p) {
  CUARENA_ASSERT(!segment_, "mapping into a segment arena");
  if (g >= phys_.size()) {
    phys_.resize(g + 1);
    dormant_.resize(g + 1);
    active_.resize(g / 64 + 1);
  }
  CUARENA_ASSERT(!phys_[g].valid(), "arena granule mapped twice");
  phys_[g] = p;
  active_[g / 64] |= std::uint64_t(1) << g % 64;
}

void Arena::clear(std::size_t g) {
  CUARENA_ASSERT(!segment_, "unmapping from a segment arena");
  CUARENA_ASSERT(has_mapping(g), "arena granule unmapped twice");
  phys_[g] = PhysRef{};
  dormant_[g] = false;
  active_[g / 64] &= ~(std::uint64_t(1) << g % 64);
}

void Arena::set_dormant(std::size_t g, bool dormant) {
  CUARENA_ASSERT(has_mapping(g) && dormant_[g] != dormant,
                 "arena granule's mapping is not in the state left");
  dormant_[g] = dormant;
  if (dormant)
    active_[g / 64] &= ~(std::uint64_t(1) << g % 64);
  else
    active_[g / 64] |= std::uint64_t(1) << g % 64;
}

std::size_t Arena::next_inactive(std::size_t first, std::size_t last) const {
  // Past the table nothing is active; a segment is active up to its end.
  const std::size_t end = std::min(last, segment_ ? size_ / granule_ : phys_.size());
  if (segment_) return std::max(first, end) < last ? std::max(first, end) : last;
  for (std::size_t g = first; g < end; g = (g / 64 + 1) * 64) {
    const std::uint64_t inactive = ~active_[g / 64] >> g % 64;
    if (inactive != 0)
      return std::min(g + std::size_t(std::countr_zero(inactive)), std::max(first, end));
  }
  return std::max(first, end) < last ? std::max(first, end) : last;
}

std::size_t Arena::count_unmapped(std::size_t first, std::size_t last) const {
  std::size_t unmapped = 0;
  for (std::size_t g = next_inactive(first, last); g < last; g = next_inactive(g + 1, last))
    ++unmapped;
  return unmapped;
}

}  // namespace cuarena::detail
