#include "arena.hpp"

#include "assert.hpp"

namespace cuarena::detail {

void Arena::set(std::size_t g, PhysRef p) {
  CUARENA_ASSERT(!segment_, "mapping into a segment arena");
  if (g >= phys_.size()) {
    phys_.resize(g + 1);
    dormant_.resize(g + 1);
  }
  CUARENA_ASSERT(!phys_[g].valid(), "arena granule mapped twice");
  phys_[g] = p;
}

void Arena::clear(std::size_t g) {
  CUARENA_ASSERT(!segment_, "unmapping from a segment arena");
  CUARENA_ASSERT(has_mapping(g), "arena granule unmapped twice");
  phys_[g] = PhysRef{};
  dormant_[g] = false;
}

void Arena::set_dormant(std::size_t g, bool dormant) {
  CUARENA_ASSERT(has_mapping(g) && dormant_[g] != dormant,
                 "arena granule's mapping is not in the state left");
  dormant_[g] = dormant;
}

std::size_t Arena::count_unmapped(std::size_t first, std::size_t last) const {
  std::size_t unmapped = 0;
  for (std::size_t g = first; g < last; ++g) unmapped += !is_mapped(g);
  return unmapped;
}

}  // namespace cuarena::detail
