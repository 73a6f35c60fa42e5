// Online defragmentation: stealing cached granules, the threshold, release_cached, and the
// out-of-memory path.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

// Ten 8 MiB blocks on stream 1, freed and finished; then one 80 MiB block on stream 2.
std::size_t fragmented_then_large(const std::string& config, Stats* stats = nullptr) {
  SimBackend sim(sim_options(1 * GiB, 1));
  // Single granules (whole_chunk_min:0): the pinned blocks' interiors can move.
  Allocator a(sim, Config::parse("small_limit:512,sweep_interval:1,whole_chunk_min:0," + config));
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) {
    ps.push_back(a.allocate(8 * MiB, 1));
    ps.push_back(a.allocate(1 * MiB + 512, 1));  // a live block between the 8 MiB ones
  }
  for (std::size_t i = 0; i < ps.size(); i += 2) a.deallocate(ps[i]);
  a.process_events();  // arms a sweep covering every free so far
  sim.advance(10);     // ... which the device then finishes
  void* big = a.allocate(80 * MiB, 2);
  EXPECT_TRUE(sim.is_mapped(addr(big), 80 * MiB));
  a.check_invariants();
  if (stats) *stats = a.stats();
  return sim.physical_bytes();
}

TEST(Defrag, StealsCachedGranulesInsteadOfGrowing) {
  Stats s;
  const std::size_t held = fragmented_then_large("", &s);
  // The free 8 MiB blocks' interior granules (3 each) move under the new block: at most the
  // 40 granules it needs plus the ~10 MiB of pins and the partial granules around them.
  EXPECT_LE(held, 80 * MiB + 10 * 2 * kGranule + 2 * kGranule);
  EXPECT_GE(s.granules_stolen, 30);
  EXPECT_GE(s.stitched_ranges, 1);
}

TEST(Defrag, ThresholdDefersStealingUntilCrossed) {
  Stats s;
  const std::size_t held = fragmented_then_large("defrag_threshold:1.0", &s);
  EXPECT_GE(held, 160 * MiB);  // grew instead
  EXPECT_EQ(s.granules_stolen, 0);
}

TEST(Defrag, CacheSlackGrowsInsteadOfMovingGranules) {
  Stats s;
  // 80 MiB of pins + 80 MiB of cached blocks is well within 200% over the allocated peak.
  const std::size_t held = fragmented_then_large("cache_slack:2.0", &s);
  EXPECT_GE(held, 160 * MiB);
  EXPECT_EQ(s.granules_stolen, 0);
  Stats tight;
  fragmented_then_large("cache_slack:0.01", &tight);
  EXPECT_GT(tight.granules_stolen, 0) << "1% slack is exceeded here, so granules must move";
}

// Placing whole chunks, the pool grows within 2% of the allocated peak
// (tuning::kWholeChunkCacheSlack) instead of moving cached memory; memory first moves it.
TEST(Defrag, WholeChunksGrowWithinTheirSlackMemoryFirstSteals) {
  for (const bool memory_first : {false, true}) {
    SimBackend sim(sim_options(4 * GiB, 1));
    Allocator a(sim,
                Config::parse(std::string("small_limit:512,sweep_interval:1") +
                              (memory_first ? ",whole_chunk_min:0" : ",whole_chunk_min:4MiB")));
    void* live = a.allocate(2 * GiB, 1);  // the peak: 2% of it is ~42 MiB of slack
    std::vector<void*> ps;
    for (int i = 0; i < 10; ++i) {
      ps.push_back(a.allocate(8 * MiB, 1));
      ps.push_back(a.allocate(1 * MiB + 512, 1));  // pins between the 8 MiB blocks
    }
    for (std::size_t i = 0; i < ps.size(); i += 2) a.deallocate(ps[i]);
    a.process_events();
    sim.advance(10);
    const std::size_t before = sim.physical_bytes();
    void* q = a.allocate(16 * MiB, 2);  // fits no free block: grow or steal
    const Stats s = a.stats();
    if (memory_first) {
      EXPECT_GT(s.granules_stolen, 0) << "memory first grew instead of stealing";
      EXPECT_LT(sim.physical_bytes(), before + 16 * MiB);
    } else {
      EXPECT_EQ(s.granules_stolen, 0) << "whole chunks stole within their slack";
      EXPECT_GE(sim.physical_bytes(), before + 16 * MiB);
    }
    a.check_invariants();
    a.deallocate(q);
    for (std::size_t i = 1; i < ps.size(); i += 2) a.deallocate(ps[i]);
    a.deallocate(live);
  }
}

TEST(Defrag, ReleaseCachedReturnsEverythingFree) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* keep = a.allocate(3 * MiB, 1);
  std::vector<void*> ps;
  for (int i = 0; i < 20; ++i) ps.push_back(a.allocate((i + 1) * MiB, i % 3));
  for (void* p : ps) a.deallocate(p);
  const std::size_t released = a.release_cached();
  EXPECT_GT(released, 0u);
  // What remains is the granules under the live block (and its chunk's siblings).
  EXPECT_LE(sim.physical_bytes(), 4 * MiB);
  EXPECT_EQ(std::size_t(reserved(a)), sim.physical_bytes());
  a.deallocate(keep);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
  a.check_invariants();
}

TEST(Defrag, OutOfMemoryWaitsForEventsBeforeGivingUp) {
  // Capacity for one 64 MiB block; stream 2 wants it right after stream 1 frees it, while the
  // device lags: the allocator must wait for stream 1, not fail (here on the host: no device
  // waits between streams).
  SimBackend sim(sim_options(64 * MiB, 1000000));
  Allocator a(sim, Config::parse("small_limit:512,internal_dependencies:False"));
  void* p = a.allocate(64 * MiB, 1);
  a.deallocate(p);
  void* q = nullptr;
  ASSERT_NO_THROW(q = a.allocate(64 * MiB, 2));
  const Stats s = a.stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_ooms, 0);
  a.deallocate(q);
  a.check_invariants();
}

// The same with device waits (the default): stream 2 takes the block ordered after stream 1 on
// the device; the host waits for nothing and nothing is retried.
TEST(Defrag, OutOfMemoryIsAvoidedByADeviceWaitWithoutAHostOne) {
  SimBackend sim(sim_options(64 * MiB, 1000000));
  Allocator a(sim, Config::parse("small_limit:512"));
  void* p = a.allocate(64 * MiB, 1);
  const std::uint64_t freed_at = sim.now();
  a.deallocate(p);
  void* q = nullptr;
  ASSERT_NO_THROW(q = a.allocate(64 * MiB, 2));
  EXPECT_EQ(q, p);
  EXPECT_TRUE(sim.waited_for(2, 1, freed_at));
  EXPECT_LT(sim.now(), 1000000u) << "the host waited for the device";
  const Stats s = a.stats();
  EXPECT_EQ(s.grow_stream_waits, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  a.deallocate(q);
  a.check_invariants();
}

TEST(Defrag, OutOfMemoryIsCleanAndRecoverable) {
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("per_process_memory_fraction:0.5"));
  std::vector<void*> ps;
  for (int i = 0; i < 5; ++i) ps.push_back(a.allocate(100 * MiB, 0));
  const Stats before = a.stats();
  try {
    a.allocate(100 * MiB, 0);
    FAIL() << "expected out of memory at 600 MiB of a 512 MiB limit";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.requested_bytes(), 100 * MiB);
    EXPECT_NE(msg.find("out of memory"), std::string::npos);
    EXPECT_NE(msg.find("100.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("512.00 MiB"), std::string::npos) << msg;  // the limit
    EXPECT_NE(msg.find("reserved but unallocated"), std::string::npos) << msg;
  }
  const Stats after = a.stats();
  EXPECT_EQ(after.num_ooms, 1);
  EXPECT_EQ(after.allocated_bytes[0].current, before.allocated_bytes[0].current);
  EXPECT_LE(sim.physical_bytes(), 512 * MiB);
  a.check_invariants();
  a.deallocate(ps[1]);
  a.deallocate(ps[3]);  // two separate holes: only stitching can serve 150 MiB
  void* big = nullptr;
  ASSERT_NO_THROW(big = a.allocate(150 * MiB, 0));
  EXPECT_TRUE(sim.is_mapped(addr(big), 150 * MiB));
  a.deallocate(big);
  for (int i : {0, 2, 4}) a.deallocate(ps[i]);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);  // nothing leaked
  a.check_invariants();
}

TEST(Defrag, RequestLargerThanTheDeviceFailsFast) {
  SimBackend sim(sim_options(256 * MiB));
  Allocator a(sim);
  EXPECT_THROW(a.allocate(300 * MiB, 0), OutOfMemoryError);
  EXPECT_THROW(a.allocate(SIZE_MAX - 100, 0), OutOfMemoryError);
  EXPECT_THROW(a.allocate(std::size_t{1} << 50, 0), OutOfMemoryError);  // beyond any address space
  EXPECT_EQ(sim.physical_bytes(), 0u);
  a.check_invariants();
}

}  // namespace
