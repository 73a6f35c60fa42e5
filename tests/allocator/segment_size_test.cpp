// segment_size(): PyTorch's get_allocation_size rule, at its boundaries and with other rules.
#include "cuarena/segment_size.hpp"

#include <gtest/gtest.h>

namespace cuarena {
namespace {

TEST(SegmentSize, PyTorchDefaultsAtTheBoundaries) {
  EXPECT_EQ(segment_size(512), 2 * MiB);  // small: one 2 MiB segment
  EXPECT_EQ(segment_size(1 * MiB), 2 * MiB);
  EXPECT_EQ(segment_size(1 * MiB + 512), 20 * MiB);  // medium: a shared 20 MiB segment
  EXPECT_EQ(segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(segment_size(10 * MiB), 10 * MiB);  // large: its size in 2 MiB steps
  EXPECT_EQ(segment_size(10 * MiB + 512), 12 * MiB);
  EXPECT_EQ(segment_size(13 * MiB + 4096 + 512), 14 * MiB);  // odd sizes round up
  EXPECT_EQ(segment_size(12345678), 12 * MiB);
  EXPECT_EQ(segment_size(1000 * MiB + 1), 1002 * MiB);
}

TEST(SegmentSize, IsConstexpr) {
  static_assert(segment_size(1 * MiB) == 2 * MiB);
  static_assert(segment_size(1 * MiB + 512) == 20 * MiB);
  static_assert(segment_size(10 * MiB) == 10 * MiB);
}

TEST(SegmentSize, TakesTheCallersRule) {
  // A 4 MiB granule (small segment), 40 MiB medium segments, limits 2 and 16 MiB.
  const SegmentSizeRule r{2 * MiB, 4 * MiB, 16 * MiB, 40 * MiB, 4 * MiB};
  EXPECT_EQ(segment_size(2 * MiB, r), 4 * MiB);
  EXPECT_EQ(segment_size(2 * MiB + 512, r), 40 * MiB);
  EXPECT_EQ(segment_size(16 * MiB - 512, r), 40 * MiB);
  EXPECT_EQ(segment_size(16 * MiB, r), 16 * MiB);
  EXPECT_EQ(segment_size(17 * MiB, r), 20 * MiB);
}

}  // namespace
}  // namespace cuarena
