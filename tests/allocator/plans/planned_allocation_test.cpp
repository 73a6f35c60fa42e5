// The allocator serving loop plans (config loop_plan), through the public API: how a plan's range
// is backed and given back. (Randomized loops: randomized_invariants_test.cpp's
// RandomizedLoopPlan.)
#include <gtest/gtest.h>

#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

// Runs `iterations` of a loop allocating `sizes` on stream 1 and freeing them in reverse.
void run(Allocator& a, const std::vector<std::size_t>& sizes, int iterations) {
  for (int it = 0; it < iterations; ++it) {
    std::vector<void*> live;
    for (std::size_t s : sizes) live.push_back(a.allocate(s, 1));
    for (auto p = live.rbegin(); p != live.rend(); ++p) a.deallocate(*p);
  }
}

TEST(LoopPlan, PuttingThePlanInUseCostsNoPeak) {
  // Each iteration's block x lives into the next one, so some block of the loop is live at every
  // point. The plan's range is reserved without memory and backed where its blocks land, taking
  // the memory the old instances free: the job never holds more than the loop needs.
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("loop_plan:True"));
  void* x = a.allocate(32 * MiB, 1);
  auto iteration = [&] {
    void* t = a.allocate(24 * MiB, 1);
    a.deallocate(x);
    x = a.allocate(32 * MiB, 1);
    a.deallocate(t);
  };
  for (int it = 0; it < 3; ++it) iteration();
  const std::int64_t pool_peak = a.stats().reserved_bytes[int(Pool::kAll)].peak;
  for (int it = 0; it < 12; ++it) iteration();
  ASSERT_GE(a.stats().loop_plans, 1) << "the loop was never planned";
  a.check_invariants();
  const Stats before = a.stats();
  for (int it = 0; it < 3; ++it) iteration();
  const Stats after = a.stats();
  EXPECT_EQ(after.map_calls, before.map_calls) << "the plan in use still maps";
  EXPECT_EQ(after.planned_allocations - before.planned_allocations, 6);
  EXPECT_LE(after.reserved_bytes[int(Pool::kAll)].peak, pool_peak);
  a.deallocate(x);
}

// A plan whose range finds no address space left (one arena took it all) is never backed: the
// loop goes on from the pool, and no request fails for it.
TEST(LoopPlan, NoAddressSpaceForARangeLeavesTheLoopToThePool) {
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("loop_plan:True,va_reserve:64TiB"));
  run(a, {32 * MiB, 24 * MiB, 4 * MiB}, 20);
  EXPECT_EQ(a.stats().loop_plans, 0);
  EXPECT_EQ(a.stats().planned_allocations, 0);
  a.check_invariants();
}

TEST(LoopPlan, ASmallRangeWithNoLiveBlockGoesBackWhole) {
  // A plan smaller than the carving gap (2 MiB) whose blocks are all freed: empty_cache() gives
  // its whole range back (it used to stay held with no block in it).
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("loop_plan:True,small_limit:512"));
  run(a, {64 * KiB, 256 * KiB, 128 * KiB}, 12);
  ASSERT_GE(a.stats().loop_plans, 1) << "the loop was never planned";
  a.release_cached();
  a.check_invariants();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

TEST(LoopPlan, APlanAfterEveryEmptyCacheReusesAddressSpace) {
  // empty_cache() retires the plan and the loop is learned again: each new range must come
  // from address space already reserved (arenas are never given back).
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("loop_plan:True"));
  for (int epoch = 0; epoch < 30; ++epoch) {
    run(a, {8 * MiB, 16 * MiB, 4 * MiB}, 8);
    a.release_cached();
  }
  a.check_invariants();
  EXPECT_GE(a.stats().loop_plans, 20);
  EXPECT_LE(a.stats().segment[int(Pool::kLarge)].current, 2) << "a new arena per plan";
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

TEST(LoopPlan, FragmentationCountsOnlyTheBackedPartOfTheRange) {
  // Free bytes are reserved bytes under no live block: the part of a plan's range that memory
  // does not back yet is not among them.
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("loop_plan:True"));
  void* x = a.allocate(32 * MiB, 1);
  for (int it = 0; it < 17; ++it) {
    void* t = a.allocate(24 * MiB, 1);
    const Stats s = a.stats();
    const Allocator::Fragmentation f = a.fragmentation();
    EXPECT_LE(std::int64_t(f.free_bytes),
              s.reserved_bytes[0].current - s.allocated_bytes[0].current)
        << "iteration " << it;
    EXPECT_LE(f.largest_free, f.free_bytes) << "iteration " << it;
    a.deallocate(x);
    x = a.allocate(32 * MiB, 1);
    a.deallocate(t);
  }
  EXPECT_GE(a.stats().loop_plans, 1);
  a.deallocate(x);
}

// A loop of A (32 MiB, stream 1), C (16 MiB, on `c_stream`) live together, then B (24 MiB,
// stream 1) once both are freed: planned A at 0, C at 32 MiB and B at 0, a range of 48 MiB.
// Runs it (plan + memory first) until a whole iteration is served by the plan, then one
// iteration that keeps A live while it asks for B: the plan cannot place B (A holds its bytes)
// and the pool serves it, with no request the plan did not foresee.
struct BWhileALives {
  std::size_t held = 0;    ///< memory held after the last whole planned iteration
  std::size_t with_b = 0;  ///< memory held while the pool's B is live
  /// An event recorded on stream 1 just before B was asked for had completed when B came back.
  bool caught_up = false;
  Stats stats;
};
BWhileALives b_while_a_lives(StreamId c_stream, std::uint64_t latency = 1) {
  SimBackend sim(sim_options(1 * GiB, latency));
  Allocator a(sim, Config::parse("loop_plan:True,whole_chunk_min:0"));
  bool caught_up = false;
  auto iteration = [&](bool deviate) {
    void* pa = a.allocate(32 * MiB, 1);
    void* pc = a.allocate(16 * MiB, c_stream);
    a.deallocate(pc);
    if (!deviate) a.deallocate(pa);
    const EventId before_b = sim.record_event(1);
    void* pb = a.allocate(24 * MiB, 1);
    caught_up = sim.event_completed(before_b);
    sim.release_event(before_b);
    const std::size_t held = sim.physical_bytes();
    if (deviate) a.deallocate(pa);
    a.deallocate(pb);
    sim.advance(300 + latency);  // past the cross-stream margin: C's fence completes
    return held;
  };
  BWhileALives r;
  for (int it = 0; it < 40; ++it) {
    const std::int64_t before = a.stats().planned_allocations;
    iteration(false);
    if (a.stats().planned_allocations - before == 3) {
      r.held = sim.physical_bytes();
      r.with_b = iteration(true);
      r.caught_up = caught_up;
      a.check_invariants();
      r.stats = a.stats();
      return r;
    }
  }
  ADD_FAILURE() << "the loop was never planned";
  return r;
}

TEST(LoopPlan, ARequestThePlanCannotPlaceTakesItsIdleMemory) {
  // B is served by the pool while C's bytes in the range lie idle: the pool takes them (16 of
  // the 24 MiB) instead of growing by all of B.
  const BWhileALives r = b_while_a_lives(1);
  EXPECT_LE(r.with_b, r.held + 8 * MiB);
  EXPECT_EQ(r.stats.num_alloc_retries, 0);
  EXPECT_GE(r.stats.loop_plans, 1);
}

TEST(LoopPlan, IdleMemoryTakenOnlyOnceTheDeviceIsPastItsBlocks) {
  // The range's idle granules are unmapped (or left dormant, to be unmapped later) on the host at
  // once: kernels still queued on C's old bytes would fault. With the device far behind, taking
  // them waits for the stream first (seen on the GPU: an illegal address in a ResNet-50 step).
  const BWhileALives r = b_while_a_lives(1, 1000);
  EXPECT_LE(r.with_b, r.held + 8 * MiB) << "C's bytes were not taken";
  EXPECT_TRUE(r.caught_up) << "taken while the device had not passed C's free";
}

TEST(LoopPlan, NoRangeMemoryForAStreamItsBlocksDidNotUse) {
  // C was on stream 2: its work there is not ordered before stream 1's B, so the pool must not
  // take C's idle bytes for B (it grows by all of B instead).
  const BWhileALives r = b_while_a_lives(2);
  EXPECT_GE(r.with_b, r.held + 24 * MiB);
}

TEST(LoopPlan, ABlockTheFirstIterationKeptIsPlannedFromALaterOne) {
  // The first iteration keeps a block for good (as an optimizer's state, made at its
  // first step, matches a later step's gradient of the same size), so the plan, made from that
  // iteration, finds it live. Planned afresh from the iterations its trial followed, it serves
  // that request too, each iteration, instead of leaving it to the pool.
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("loop_plan:True,whole_chunk_min:0"));
  constexpr int kRequests = 10;
  void* kept = nullptr;
  auto iteration = [&](int it) {
    std::vector<void*> live;
    for (int k = 0; k < kRequests; ++k) live.push_back(a.allocate(std::size_t(k + 1) * MiB, 1));
    if (it == 0) kept = live[kRequests / 2];
    for (void* p : live)
      if (p != kept) a.deallocate(p);
  };
  for (int it = 0; it < 12; ++it) iteration(it);
  ASSERT_GE(a.stats().loop_plans, 1) << "the loop was never planned";
  const Stats before = a.stats();
  for (int it = 12; it < 15; ++it) iteration(it);
  const Stats after = a.stats();
  EXPECT_EQ(after.planned_allocations - before.planned_allocations, 3 * kRequests);
  EXPECT_EQ(after.map_calls, before.map_calls);
  a.check_invariants();
  a.deallocate(kept);
}

// A target not met yet: today the foreign request makes the planner hand out a period it
// confirmed earlier (the loop twice, which the foreign request just broke), and none of the next
// four iterations is planned. Trusting the cursor after a miss or two and checking that a
// handed-out period still matches meet it, but move other traces (docs/results.md, 2026-12-07
// evening).
TEST(LoopPlan, DISABLED_ARequestBetweenIterationsLeavesThePlanInPlace) {
  // A request the loop does not make, between two iterations (as at an epoch's end): the plan
  // goes on with the next iteration's first request, in place, though the window of recent
  // requests that finds a lost place holds the foreign one a while longer.
  SimBackend sim(sim_options());
  Allocator a(sim, Config::parse("loop_plan:True,whole_chunk_min:0"));
  const std::vector<std::size_t> sizes = {8 * MiB, 12 * MiB, 4 * MiB, 16 * MiB, 6 * MiB, 10 * MiB};
  run(a, sizes, 12);
  ASSERT_GE(a.stats().loop_plans, 1) << "the loop was never planned";
  const std::int64_t plans = a.stats().loop_plans;
  a.deallocate(a.allocate(3 * MiB, 1));  // not the loop's (the pool serves it)
  const Stats before = a.stats();
  run(a, sizes, 4);
  const Stats after = a.stats();
  EXPECT_EQ(after.planned_allocations - before.planned_allocations, 4 * 6);
  EXPECT_EQ(after.loop_plans, plans) << "another plan took over";
  a.check_invariants();
}

}  // namespace
