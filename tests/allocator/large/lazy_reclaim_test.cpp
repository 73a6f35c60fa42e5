// BlockPool's step before growing (LazyReclaimer): memory a lazy block holds mapped under no
// block of its user's (a loop plan's range between its blocks) backs the pool's requests instead
// of fresh memory, and comes back to the lazy block when its user needs it.
#include <gtest/gtest.h>

#include <vector>

#include "front/context.hpp"
#include "large/block_pool.hpp"
#include "test_support.hpp"

namespace cuarena::detail {
namespace {

// A user of one lazy block with no live data in it: gives the pool all it may take.
class WholeRange final : public LazyReclaimer {
 public:
  WholeRange(BlockPool& pool, Block* range) : pool_(pool), range_(range) {}
  std::size_t reclaim(std::size_t granules, StreamId) override {
    ++calls;
    return pool_.idle_unused(range_, range_->addr, range_->end(), granules, taken);
  }
  std::vector<DevicePtr> taken;
  int calls = 0;

 private:
  BlockPool& pool_;
  Block* range_;
};

struct Pool {
  explicit Pool(const std::string& conf)
      : sim(test::sim_options(1 * GiB)),
        config(Config::parse(conf)),
        ctx{sim, config, stats, sim.granularity(), sim.capacity(), 0, {}},
        pool(ctx) {}
  SimBackend sim;
  Config config;
  Stats stats;
  Context ctx;
  BlockPool pool;
};

TEST(LazyReclaim, ThePoolTakesTheRangesIdleGranulesBeforeGrowing) {
  Pool p("whole_chunk_min:0");
  Block* range = p.pool.reserve_lazy(64 * MiB, 1);
  ASSERT_NE(range, nullptr);
  ASSERT_TRUE(p.pool.back_part(range, range->addr, 64 * MiB, 1));
  ASSERT_EQ(p.sim.physical_bytes(), 64 * MiB);
  WholeRange user(p.pool, range);
  p.pool.set_reclaimer(&user);
  Block* b = p.pool.try_allocate(40 * MiB, 1);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(p.sim.physical_bytes(), 64 * MiB) << "grew beside the range's idle memory";
  EXPECT_GE(user.calls, 1);
  EXPECT_EQ(user.taken.size(), 20u) << "the range gives what the request lacks, no more";
  // Taken from the top: the range's low end, which its user reuses first, stays mapped.
  for (DevicePtr g : user.taken) EXPECT_GE(g, range->addr + 24 * MiB);
  EXPECT_TRUE(p.pool.backed(range, range->addr, 24 * MiB));
  EXPECT_FALSE(p.pool.backed(range, range->addr + 24 * MiB, 40 * MiB));
  p.pool.check_invariants();
  // Once the block is freed, the range's user backs its part again with that memory.
  p.pool.deallocate(b);
  p.pool.set_reclaimer(nullptr);
  ASSERT_TRUE(p.pool.back_part(range, range->addr + 24 * MiB, 40 * MiB, 1));
  EXPECT_EQ(p.sim.physical_bytes(), 64 * MiB);
  EXPECT_TRUE(p.pool.backed(range, range->addr, 64 * MiB));
  p.pool.check_invariants();
  p.pool.deallocate(range);
}

TEST(LazyReclaim, WithoutAReclaimerThePoolGrows) {
  // The same requests with nobody to ask: the figure the test above keeps the pool under.
  Pool p("whole_chunk_min:0");
  Block* range = p.pool.reserve_lazy(64 * MiB, 1);
  ASSERT_TRUE(p.pool.back_part(range, range->addr, 64 * MiB, 1));
  Block* b = p.pool.try_allocate(40 * MiB, 1);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(p.sim.physical_bytes(), 104 * MiB);
  p.pool.check_invariants();
  p.pool.deallocate(b);
  p.pool.deallocate(range);
}

TEST(LazyReclaim, AWholeChunkGoesOnlyWhenAllOfItIsIdle) {
  // Whole chunks (fresh memory for long runs when whole_chunk_min is set; here two of 32 MiB)
  // move as one piece: of a run covering one and half of the other, only the first may go.
  Pool p("whole_chunk_min:4MiB");
  Block* range = p.pool.reserve_lazy(64 * MiB, 1);
  ASSERT_TRUE(p.pool.back_part(range, range->addr, 64 * MiB, 1));
  ASSERT_EQ(p.sim.live_whole_chunks(), 2u);
  std::vector<DevicePtr> taken;
  EXPECT_EQ(p.pool.idle_unused(range, range->addr + 16 * MiB, range->end(), 32, taken), 16u);
  ASSERT_EQ(taken.size(), 16u);
  for (DevicePtr g : taken) EXPECT_GE(g, range->addr + 32 * MiB);
  EXPECT_TRUE(p.pool.backed(range, range->addr, 32 * MiB));
  p.pool.check_invariants();
  p.pool.deallocate(range);
}

}  // namespace
}  // namespace cuarena::detail
