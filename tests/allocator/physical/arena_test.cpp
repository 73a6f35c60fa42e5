// Arena (allocator/src/arena.hpp): its active-granule bitset against a plain model, through
// random mapping, unmapping and dormancy, and next_inactive() over random ranges.
#include "physical/arena.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace cuarena::detail {
namespace {

constexpr std::size_t kGranule = 2 << 20;

std::size_t naive_next_inactive(const Arena& a, std::size_t first, std::size_t last) {
  for (std::size_t g = first; g < last; ++g)
    if (!a.is_mapped(g)) return g;
  return last;
}

TEST(Arena, NextInactiveMatchesAGranuleByGranuleScan) {
  Arena a(0, 4096 * kGranule, kGranule);
  enum State { kNone, kActive, kDormant };
  std::vector<State> model(600, kNone);
  std::mt19937 rng(11);
  for (int step = 0; step < 20000; ++step) {
    // Runs of granules change together, as mappings do, so long active runs cross words.
    const std::size_t g0 = rng() % model.size(), n = 1 + rng() % 80;
    const int op = int(rng() % 3);
    for (std::size_t g = g0; g < std::min(model.size(), g0 + n); ++g) {
      if (op == 0 && model[g] == kNone) {
        a.set(g, PhysRef{1, std::uint32_t(g)});
        model[g] = kActive;
      } else if (op == 1 && model[g] != kNone) {
        a.clear(g);
        model[g] = kNone;
      } else if (op == 2 && model[g] != kNone) {
        a.set_dormant(g, model[g] == kActive);
        model[g] = model[g] == kActive ? kDormant : kActive;
      }
    }
    for (int q = 0; q < 4; ++q) {
      const std::size_t first = rng() % 700, last = first + rng() % 300;
      std::size_t unmapped = 0;
      for (std::size_t g = first; g < last; ++g) {
        const bool active = g < model.size() && model[g] == kActive;
        ASSERT_EQ(a.is_mapped(g), active) << "granule " << g << " at step " << step;
        unmapped += !active;
      }
      ASSERT_EQ(a.next_inactive(first, last), naive_next_inactive(a, first, last))
          << "[" << first << ", " << last << ") at step " << step;
      ASSERT_EQ(a.count_unmapped(first, last), unmapped);
    }
  }
}

TEST(Arena, ASegmentIsActiveToItsEnd) {
  Arena a(0, 100 * kGranule, kGranule, /*segment=*/true);
  EXPECT_EQ(a.next_inactive(0, 100), 100u);
  EXPECT_EQ(a.next_inactive(0, 150), 100u);
  EXPECT_EQ(a.next_inactive(120, 150), 120u);
  EXPECT_EQ(a.next_inactive(5, 5), 5u);
  EXPECT_EQ(a.count_unmapped(90, 110), 10u);
}

}  // namespace
}  // namespace cuarena::detail
