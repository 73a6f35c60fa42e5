#include "physical/arena.hpp"

#include <bit>

#include "support/assert.hpp"

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
  mark_active(g, true);
}

void Arena::clear(std::size_t g) {
  CUARENA_ASSERT(!segment_, "unmapping from a segment arena");
  CUARENA_ASSERT(has_mapping(g), "arena granule unmapped twice");
  phys_[g] = PhysRef{};
  dormant_[g] = false;
  mark_active(g, false);
}

void Arena::set_dormant(std::size_t g, bool dormant) {
  CUARENA_ASSERT(has_mapping(g) && dormant_[g] != dormant,
                 "arena granule's mapping is not in the state left");
  dormant_[g] = dormant;
  mark_active(g, !dormant);
}

void Arena::mark_active(std::size_t g, bool active) {
  const std::uint64_t bit = std::uint64_t(1) << g % 64;
  active_[g / 64] = active ? active_[g / 64] | bit : active_[g / 64] & ~bit;
}

std::size_t Arena::next_inactive(std::size_t first, std::size_t last) const {
  CUARENA_ASSERT(first <= last, "next_inactive: an empty range must not run backwards");
  // Nothing past the table is active; a segment is active up to its end.
  const std::size_t end = std::min(last, segment_ ? size_ / granule_ : phys_.size());
  if (!segment_) {
    for (std::size_t g = first; g < end; g = (g / 64 + 1) * 64) {
      const std::uint64_t inactive = ~active_[g / 64] >> g % 64;
      if (inactive != 0) return std::min(g + std::size_t(std::countr_zero(inactive)), end);
    }
  }
  return std::max(first, end);
}

std::size_t Arena::count_unmapped(std::size_t first, std::size_t last) const {
  std::size_t unmapped = 0;
  for (std::size_t g = next_inactive(first, last); g < last; g = next_inactive(g + 1, last))
    ++unmapped;
  return unmapped;
}

}  // namespace cuarena::detail
