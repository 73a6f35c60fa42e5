// Loop plans and graph capture: a plan never records an event on, nor makes wait, a stream under
// graph capture (the simulator throws on either). The paths: a pending free of a planned block
// finishing while its own stream is captured (its fence would be recorded there), a planned
// request on a captured stream whose bytes another stream freed (a device wait), and the
// pool taking a plan's idle granules for a captured stream (a host wait on it).
#include <gtest/gtest.h>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

// Only what PyTorch's adapter does: x (stream 1, used on stream 2) is freed before stream 1's
// capture begins; its pending free comes due during the capture, while stream 3 allocates.
TEST(PlanCapture, APendingFreeOfAPlannedBlockWaitsForItsStreamsCapture) {
  constexpr std::uint64_t kLat = 50;
  SimBackend sim(sim_options(4 * GiB, kLat));
  Allocator a(sim, Config::parse("loop_plan:True"));
  auto iteration = [&](bool capture) {
    void* x = a.allocate(32 * MiB, 1);
    a.record_stream(x, 2);
    a.deallocate(x);  // pending on stream 2's event
    if (capture) sim.begin_capture(1);
    sim.advance(kLat + 1);
    void* y = nullptr;
    EXPECT_NO_THROW(y = a.allocate(32 * MiB, 3));
    if (capture) {
      EXPECT_EQ(a.stats().pending_frees, 1) << "finished a free into a captured stream";
      sim.end_capture(1);
    }
    if (y) a.deallocate(y);
    sim.advance(kLat + 1);
  };
  for (int it = 0; it < 15; ++it) iteration(false);
  ASSERT_GE(a.stats().loop_plans, 1);
  iteration(true);
  a.process_events();
  EXPECT_EQ(a.stats().pending_frees, 0) << "the free never finished after the capture";
  a.check_invariants();
}

// Stream 1 frees A, then stream 2 takes A's bytes with a device wait, every iteration; once
// stream 2 is captured, its request is served without the wait (elsewhere).
TEST(PlanCapture, APlannedRequestOnACapturedStreamWaitsForNoOtherStream) {
  SimBackend sim(sim_options(4 * GiB, 1000000));
  Allocator a(sim, Config::parse("loop_plan:True"));
  std::int64_t waits_for_y = 0;  // stream 2's device waits for its request, last iteration
  auto iteration = [&](bool capture) {
    void* x = a.allocate(32 * MiB, 1);
    a.deallocate(x);
    if (capture) sim.begin_capture(2);
    const std::int64_t before = a.stats().stream_waits;
    void* y = nullptr;
    EXPECT_NO_THROW(y = a.allocate(32 * MiB, 2));
    waits_for_y = a.stats().stream_waits - before;
    if (capture) sim.end_capture(2);
    if (y) a.deallocate(y);
  };
  for (int it = 0; it < 15; ++it) iteration(false);
  ASSERT_GE(a.stats().loop_plans, 1);
  ASSERT_EQ(waits_for_y, 1) << "the test needs the plan's device wait";
  iteration(true);
  EXPECT_EQ(waits_for_y, 0);
  a.check_invariants();
}

// A request the plan cannot place (B while A lives) takes the plan's idle granules after a host
// wait for its stream; on a captured stream it grows instead.
TEST(PlanCapture, TheIdleGranulesOfAPlanAreNotTakenForACapturedStream) {
  SimBackend sim(sim_options(1 * GiB, 1000));
  Allocator a(sim, Config::parse("loop_plan:True,whole_chunk_min:0"));
  auto iteration = [&](bool deviate) {
    void* pa = a.allocate(32 * MiB, 1);
    void* pc = a.allocate(16 * MiB, 1);
    a.deallocate(pc);
    if (!deviate) a.deallocate(pa);
    if (deviate) sim.begin_capture(1);
    void* pb = nullptr;
    EXPECT_NO_THROW(pb = a.allocate(24 * MiB, 1));
    if (deviate) {
      sim.end_capture(1);
      a.deallocate(pa);
    }
    if (pb) a.deallocate(pb);
    sim.advance(1300);
  };
  for (int it = 0; it < 40; ++it) {
    const std::int64_t before = a.stats().planned_allocations;
    iteration(false);
    if (a.stats().planned_allocations - before == 3) {
      iteration(true);
      a.check_invariants();
      return;
    }
  }
  FAIL() << "the loop was never planned";
}

}  // namespace
