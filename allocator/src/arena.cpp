#include "arena.hpp"

#include <bit>

namespace cuarena::detail {

void Arena::set_mapped(std::size_t first, std::size_t count, bool mapped) {
  const std::size_t last = first + count;
  if (mapped && (last + 63) / 64 > bits_.size()) bits_.resize((last + 63) / 64, 0);
  for (std::size_t g = first; g < last; ++g) {
    std::uint64_t& word = bits_[g / 64];
    const std::uint64_t bit = std::uint64_t{1} << (g % 64);
    if (mapped && !(word & bit)) {
      word |= bit;
      ++mapped_count_;
    } else if (!mapped && (word & bit)) {
      word &= ~bit;
      --mapped_count_;
    }
  }
}

std::size_t Arena::count_unmapped(std::size_t first, std::size_t last) const {
  std::size_t unmapped = 0;
  for (std::size_t g = first; g < last; ++g) unmapped += !is_mapped(g);
  return unmapped;
}

}  // namespace cuarena::detail
