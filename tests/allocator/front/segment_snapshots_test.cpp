// Allocator::segments() and find(): what the PyTorch adapter's snapshots and getBaseAllocation
// read. The pieces must tile every segment, and the segments must add up to reserved bytes.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

using State = Allocator::SegmentInfo::State;

/// Checks tiling and returns (bytes in segments, bytes allocated, bytes pending).
struct Totals {
  std::size_t segments = 0, allocated = 0, pending = 0, requested = 0;
};
Totals check_tiling(const Allocator& a) {
  Totals t;
  for (const auto& seg : a.segments()) {
    EXPECT_EQ(seg.addr % kGranule, 0u);
    EXPECT_EQ(seg.size % kGranule, 0u);
    DevicePtr pos = seg.addr;
    for (const auto& b : seg.blocks) {
      EXPECT_EQ(b.addr, pos) << "pieces must tile the segment";
      EXPECT_GT(b.size, 0u);
      pos += b.size;
      if (b.state == State::kAllocated) {
        t.allocated += b.size;
        t.requested += b.requested;
      }
      if (b.state == State::kPendingFree) t.pending += b.size;
      if (b.state == State::kInactive) {
        EXPECT_EQ(b.requested, 0u);
      }
    }
    EXPECT_EQ(pos, seg.addr + seg.size);
    t.segments += seg.size;
  }
  return t;
}

TEST(Segments, TileReservedMemoryAndListEveryAllocation) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* big = a.allocate(5 * MiB + 3, 7);
  void* small1 = a.allocate(1000, 7);
  void* small2 = a.allocate(4096, 7);
  const Totals t = check_tiling(a);
  const Stats s = a.stats();
  EXPECT_EQ(std::int64_t(t.segments), s.reserved_bytes[int(Pool::kAll)].current);
  EXPECT_EQ(std::int64_t(t.allocated), s.allocated_bytes[int(Pool::kAll)].current);
  EXPECT_EQ(t.requested, 5 * MiB + 3 + 1000 + 4096);
  bool seen_big = false;
  for (const auto& seg : a.segments()) {
    for (const auto& b : seg.blocks) {
      if (b.addr == addr(big)) {
        seen_big = true;
        EXPECT_EQ(b.state, State::kAllocated);
        EXPECT_EQ(b.stream, 7u);
        EXPECT_EQ(seg.stream, 7u);
      }
    }
  }
  EXPECT_TRUE(seen_big);
  a.deallocate(big);
  a.deallocate(small1);
  a.deallocate(small2);
  EXPECT_EQ(check_tiling(a).allocated, 0u);
}

TEST(Segments, PendingFreesShowAsPending) {
  SimBackend sim(sim_options(1 * GiB, /*latency=*/1000));
  Allocator a(sim);
  void* p = a.allocate(8 * MiB, 1);
  a.record_stream(p, 2);
  a.deallocate(p);
  const Totals t = check_tiling(a);
  EXPECT_EQ(t.pending, 8 * MiB);
  EXPECT_EQ(t.allocated, 0u);
}

TEST(Segments, FindReturnsOnlyLiveAllocationStarts) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* p = a.allocate(3 * MiB, 4);
  auto info = a.find(p);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->ptr, addr(p));
  EXPECT_EQ(info->size, 3 * MiB);
  EXPECT_EQ(info->stream, 4u);
  EXPECT_FALSE(info->small);
  EXPECT_FALSE(a.find(static_cast<char*>(p) + 512).has_value());
  a.deallocate(p);
  EXPECT_FALSE(a.find(p).has_value());
}

TEST(Segments, RandomizedTilingMatchesStatistics) {
  SimBackend sim(sim_options(4 * GiB));
  Allocator a(sim);
  std::mt19937_64 rng(42);
  std::vector<void*> live;
  for (int i = 0; i < 3000; ++i) {
    if (live.size() < 64 && (live.empty() || rng() % 3 != 0)) {
      const std::size_t bytes = rng() % 2 ? 1 + rng() % (1 * MiB) : 1 + rng() % (24 * MiB);
      live.push_back(a.allocate(bytes, 1 + rng() % 3));
    } else {
      const std::size_t k = rng() % live.size();
      a.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 100 == 0) {
      const Totals t = check_tiling(a);
      const Stats s = a.stats();
      ASSERT_EQ(std::int64_t(t.allocated), s.allocated_bytes[int(Pool::kAll)].current) << i;
      ASSERT_EQ(std::int64_t(t.requested), s.requested_bytes[int(Pool::kAll)].current) << i;
      ASSERT_GE(std::int64_t(t.segments), s.allocated_bytes[int(Pool::kAll)].current) << i;
    }
  }
  for (void* p : live) a.deallocate(p);
}

}  // namespace
