// Allocation, rounding, packing, coalescing and slabs, through the public API.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

TEST(Allocator, LargeBlocksAreRoundedAlignedAndMapped) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* p = a.allocate(3 * MiB + 1, 1);
  EXPECT_EQ(addr(p) % 512, 0u);
  EXPECT_TRUE(sim.is_mapped(addr(p), 3 * MiB + 1));
  const Stats s = a.stats();
  EXPECT_EQ(s.allocated_bytes[int(Pool::kLarge)].current, std::int64_t(3 * MiB + 512));
  EXPECT_EQ(s.requested_bytes[int(Pool::kAll)].current, std::int64_t(3 * MiB + 1));
  EXPECT_EQ(reserved(a), std::int64_t(4 * MiB));  // two granules cover it
  a.deallocate(p);
  a.check_invariants();
}

TEST(Allocator, ZeroBytesAndNullptr) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  EXPECT_EQ(a.allocate(0, 0), nullptr);
  EXPECT_NO_THROW(a.deallocate(nullptr));
  EXPECT_EQ(a.stats().allocation[0].current, 0);
}

TEST(Allocator, SameStreamReuseNeedsNoNewMemory) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* p = a.allocate(40 * MiB, 1);
  a.deallocate(p);
  const auto before = sim.physical_bytes();
  void* q = a.allocate(40 * MiB, 1);
  EXPECT_EQ(q, p);
  EXPECT_EQ(sim.physical_bytes(), before);
  a.deallocate(q);
}

TEST(Allocator, BlocksPackAcrossGranules) {
  // 64 blocks of 1.5 MiB + 512 B: separately granule-aligned they would need 128 granules.
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("small_limit:512"));
  std::vector<void*> ps;
  for (int i = 0; i < 64; ++i) ps.push_back(a.allocate(3 * MiB / 2 + 512, 1));
  const std::size_t live = 64 * (3 * MiB / 2 + 512);
  EXPECT_LE(sim.physical_bytes(), round_up(live, kGranule) + kGranule);
  for (void* p : ps) a.deallocate(p);
  a.check_invariants();
}

TEST(Allocator, FreeNeighboursCoalesce) {
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("small_limit:512"));
  void* x = a.allocate(4 * MiB, 1);
  void* y = a.allocate(4 * MiB, 1);
  void* z = a.allocate(4 * MiB, 1);
  ASSERT_EQ(addr(y), addr(x) + 4 * MiB);
  a.deallocate(x);
  a.deallocate(y);
  // One 8 MiB free block now: an 8 MiB request lands exactly there, with no new memory.
  const auto before = sim.physical_bytes();
  void* w = a.allocate(8 * MiB, 1);
  EXPECT_EQ(w, x);
  EXPECT_EQ(sim.physical_bytes(), before);
  a.deallocate(w);
  a.deallocate(z);
  a.check_invariants();
}

TEST(Allocator, BestFitPrefersTheTightestBlock) {
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("small_limit:512"));
  void* big = a.allocate(20 * MiB, 1);
  void* sep1 = a.allocate(2 * MiB, 1);
  void* tight = a.allocate(6 * MiB, 1);
  void* sep2 = a.allocate(2 * MiB, 1);
  a.deallocate(big);
  a.deallocate(tight);
  EXPECT_EQ(a.allocate(5 * MiB, 1), tight);
  a.deallocate(tight);
  a.deallocate(sep1);
  a.deallocate(sep2);
}

TEST(Allocator, SmallRequestsComeFromSlabs) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  std::set<DevicePtr> seen;
  std::vector<void*> ps;
  for (int i = 0; i < 5000; ++i) {
    void* p = a.allocate(600, 3);
    ASSERT_EQ(addr(p) % 512, 0u);
    ASSERT_TRUE(seen.insert(addr(p)).second);
    ps.push_back(p);
  }
  Stats s = a.stats();
  EXPECT_EQ(s.allocated_bytes[int(Pool::kSmall)].current, 5000 * 1024);  // class of 600 B
  EXPECT_GE(s.segment[int(Pool::kSmall)].current, 2);
  const auto slab = std::int64_t(a.config().slab_size / 1024 * 1024);  // whole 1 KiB slots
  EXPECT_EQ(s.reserved_bytes[int(Pool::kSmall)].current,
            s.segment[int(Pool::kSmall)].current * slab);
  a.check_invariants();
  for (void* p : ps) a.deallocate(p);
  s = a.stats();
  // Every slab emptied and went back to the pool.
  EXPECT_EQ(s.segment[int(Pool::kSmall)].current, 0);
  EXPECT_EQ(s.reserved_bytes[int(Pool::kSmall)].current, 0);
  EXPECT_EQ(s.slabs_created, s.slabs_released);
  a.check_invariants();
}

TEST(Allocator, EmptySlabMemoryServesLargeRequests) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  std::vector<void*> ps;
  for (int i = 0; i < 4096; ++i) ps.push_back(a.allocate(4096, 1));  // 16 MiB of slabs
  const auto held = sim.physical_bytes();
  for (void* p : ps) a.deallocate(p);
  void* big = a.allocate(16 * MiB, 1);  // same stream: reuses the slabs' memory
  EXPECT_EQ(sim.physical_bytes(), held);
  a.deallocate(big);
}

TEST(Allocator, BadPointersAreTypedErrors) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* p = a.allocate(100, 0);
  int on_host = 0;
  EXPECT_THROW(a.deallocate(&on_host), InvalidPointerError);
  EXPECT_THROW(a.deallocate(static_cast<char*>(p) + 512), InvalidPointerError);
  EXPECT_THROW(a.record_stream(&on_host, 2), InvalidPointerError);
  a.deallocate(p);
  try {
    a.deallocate(p);
    FAIL() << "double free not detected";
  } catch (const InvalidPointerError& e) {
    EXPECT_NE(std::string(e.what()).find("already freed"), std::string::npos);
  }
  a.check_invariants();
}

TEST(Allocator, StatsFollowPyTorchNames) {
  SimBackend sim(sim_options());
  Allocator a(sim);
  void* p = a.allocate(10 * MiB, 0);
  void* q = a.allocate(1000, 0);
  const auto m = a.stats().to_map();
  EXPECT_EQ(m.at("allocation.all.current"), 2);
  EXPECT_EQ(m.at("allocation.large_pool.current"), 1);
  EXPECT_EQ(m.at("allocation.small_pool.current"), 1);
  EXPECT_EQ(m.at("requested_bytes.all.current"), std::int64_t(10 * MiB + 1000));
  EXPECT_EQ(m.at("allocated_bytes.all.current"), std::int64_t(10 * MiB + 1024));
  EXPECT_EQ(m.at("active_bytes.all.current"), m.at("allocated_bytes.all.current"));
  EXPECT_EQ(m.at("reserved_bytes.all.current"), std::int64_t(sim.physical_bytes()));
  EXPECT_EQ(m.at("inactive_split_bytes.all.current"),
            m.at("reserved_bytes.all.current") - m.at("active_bytes.all.current"));
  EXPECT_EQ(m.count("num_ooms"), 1u);
  EXPECT_EQ(m.count("cuarena.granules_stolen"), 1u);
  a.deallocate(p);
  a.deallocate(q);
  const auto after = a.stats().to_map();
  EXPECT_EQ(after.at("allocation.all.current"), 0);
  EXPECT_EQ(after.at("allocation.all.peak"), 2);
  EXPECT_EQ(after.at("allocation.all.allocated"), 2);
  EXPECT_EQ(after.at("allocation.all.freed"), 2);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().to_map().at("allocation.all.peak"), 0);
}

TEST(Allocator, OwnsItsAddressSpaceOnly) {
  SimBackend sim(sim_options());
  Allocator a(sim), b(sim);
  void* p = a.allocate(5 * MiB, 0);
  void* q = b.allocate(100, 0);
  int on_host = 0;
  EXPECT_TRUE(a.owns(p));
  EXPECT_FALSE(a.owns(q));
  EXPECT_TRUE(b.owns(q));
  EXPECT_FALSE(a.owns(&on_host));
  a.deallocate(p);
  EXPECT_TRUE(a.owns(p)) << "freed, but still this allocator's address space";
  b.deallocate(q);
}

TEST(Allocator, DestructionReleasesEverything) {
  SimBackend sim(sim_options());
  {
    Allocator a(sim);
    a.allocate(5 * MiB, 0);
    a.allocate(100, 1);
    EXPECT_GT(sim.physical_bytes(), 0u);
  }
  EXPECT_EQ(sim.physical_bytes(), 0u);
  EXPECT_EQ(sim.live_chunks(), 0u);
  EXPECT_EQ(sim.live_events(), 0u);
}

TEST(Allocator, InconsistentConfigIsRejected) {
  SimBackend sim(sim_options());
  EXPECT_THROW(Allocator(sim, Config::parse("small_limit:4MiB,slab_size:1MiB")), ConfigError);
}

}  // namespace
