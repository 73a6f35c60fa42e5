// Segment mode: the core over an upstream that cannot map (cudaMalloc, cudaMallocAsync),
// modelled by SimBackend with `segments` set. Any mapping call would throw in the simulator.
#include <gtest/gtest.h>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

SimBackend segment_sim(std::size_t capacity, std::uint64_t latency = 1) {
  SimBackend::Options o = sim_options(capacity, latency);
  o.segments = true;
  return SimBackend(o);
}

std::int64_t segments(const Allocator& a) { return a.stats().segment[int(Pool::kAll)].current; }

}  // namespace

TEST(SegmentMode, SegmentSizesFollowPyTorch) {
  SimBackend sim = segment_sim(1 * GiB);
  ASSERT_FALSE(sim.supports_mapping());
  Allocator a(sim, Config::parse("upstream:malloc"));
  void* small = a.allocate(1000, 0);  // a slab: its 1 MiB block lives in a 2 MiB segment
  EXPECT_EQ(sim.physical_bytes(), 2 * MiB);
  void* mid = a.allocate(5 * MiB, 0);  // under 10 MiB: a 20 MiB segment shared by its peers
  EXPECT_EQ(sim.physical_bytes(), 22 * MiB);
  void* mid2 = a.allocate(5 * MiB, 0);  // fits in the same segment
  EXPECT_EQ(sim.physical_bytes(), 22 * MiB);
  void* big = a.allocate(33 * MiB + 1, 0);  // its own segment, rounded to the granule
  EXPECT_EQ(sim.physical_bytes(), 22 * MiB + 34 * MiB);
  EXPECT_EQ(segments(a), 3 + 1);  // three segments plus the slab, counted as PyTorch does
  EXPECT_NO_THROW(a.check_invariants());
  for (void* p : {small, mid, mid2, big}) a.deallocate(p);
  EXPECT_EQ(sim.physical_bytes(), 56 * MiB) << "free segments stay cached";
  EXPECT_EQ(a.release_cached(), 56 * MiB);
  EXPECT_EQ(sim.physical_bytes(), 0u);
  EXPECT_EQ(sim.trims(), 1u) << "release_cached must also trim the upstream's own cache";
  EXPECT_NO_THROW(a.check_invariants());
}

TEST(SegmentMode, OutOfMemoryReleasesFreeSegmentsAndRetries) {
  SimBackend sim = segment_sim(100 * MiB);
  Allocator a(sim, Config::parse("upstream:malloc"));
  void* p = a.allocate(60 * MiB, 0);
  a.deallocate(p);
  // 60 MiB sit cached in a free segment; 80 MiB only fit once it is returned.
  void* q = a.allocate(80 * MiB, 0);
  EXPECT_EQ(sim.physical_bytes(), 80 * MiB);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_THROW(a.allocate(40 * MiB, 0), OutOfMemoryError);
  EXPECT_NO_THROW(a.check_invariants());
  a.deallocate(q);
  void* r = a.allocate(40 * MiB, 0);
  EXPECT_NO_THROW(a.check_invariants());
  a.deallocate(r);
}

TEST(SegmentMode, NearTheLimitASegmentIsSizedToTheRequest) {
  SimBackend sim = segment_sim(30 * MiB);
  Allocator a(sim, Config::parse("upstream:malloc"));
  void* p = a.allocate(24 * MiB, 0);
  void* q = a.allocate(5 * MiB, 0);  // a 20 MiB segment would not fit; 6 MiB does
  EXPECT_EQ(sim.physical_bytes(), 30 * MiB);
  a.deallocate(p);
  a.deallocate(q);
  EXPECT_NO_THROW(a.check_invariants());
}
