#include "cuarena/size_classes.hpp"

#include <gtest/gtest.h>

#include "cuarena/errors.hpp"
#include "cuarena/types.hpp"

using namespace cuarena;

TEST(SizeClasses, EveryRequestGetsTheSmallestClassThatFits) {
  const SizeClasses c(1 * MiB, 4);
  for (std::size_t bytes = 1; bytes <= 1 * MiB; bytes += 37) {
    const std::size_t idx = c.index(bytes);
    ASSERT_GE(c.size(idx), bytes);
    if (idx > 0) {
      ASSERT_LT(c.size(idx - 1), bytes) << bytes;
    }
  }
  EXPECT_EQ(c.size(c.index(1 * MiB)), 1 * MiB);
}

TEST(SizeClasses, AlignedTo512AndStrictlyIncreasing) {
  const SizeClasses c(1 * MiB, 4);
  EXPECT_EQ(c.size(0), 512u);
  for (std::size_t i = 0; i < c.count(); ++i) {
    EXPECT_EQ(c.size(i) % 512, 0u);
    if (i) {
      EXPECT_GT(c.size(i), c.size(i - 1));
    }
  }
}

TEST(SizeClasses, AtLeastFourPerDoublingAboveTwoKiB) {
  const SizeClasses c(1 * MiB, 4);
  for (std::size_t lo = 2 * KiB; lo < 1 * MiB; lo *= 2) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < c.count(); ++i) n += c.size(i) > lo && c.size(i) <= 2 * lo;
    EXPECT_GE(n, 4u) << "in (" << lo << ", " << 2 * lo << "]";
  }
}

TEST(SizeClasses, RoundingWasteBoundedByQuarterAboveTwoKiB) {
  const SizeClasses c(1 * MiB, 4);
  for (std::size_t bytes = 2 * KiB + 1; bytes <= 1 * MiB; bytes += 129) {
    const double waste = double(c.size(c.index(bytes)) - bytes) / double(bytes);
    ASSERT_LT(waste, 0.25) << bytes;
  }
}

TEST(SizeClasses, MoreDivisionsMeanFinerClasses) {
  EXPECT_GT(SizeClasses(1 * MiB, 8).count(), SizeClasses(1 * MiB, 4).count());
  EXPECT_THROW(SizeClasses(1 * MiB, 0), ConfigError);
  EXPECT_THROW(SizeClasses(100, 4), ConfigError);
}
