#include <gtest/gtest.h>

#include <stdexcept>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

TEST(SimBackend, CountsPhysicalBytesAndEnforcesCapacity) {
  SimBackend sim(sim_options(8 * MiB));
  const DevicePtr va = sim.reserve_address(64 * MiB);
  EXPECT_EQ(va % kGranule, 0u);
  const PhysHandle a = sim.create_physical(6 * MiB);
  ASSERT_NE(a, 0u);
  EXPECT_EQ(sim.create_physical(4 * MiB), 0u);  // over capacity: refused, not thrown
  EXPECT_EQ(sim.physical_bytes(), 6 * MiB);
  sim.map(va, 4 * MiB, a, 2 * MiB);
  EXPECT_TRUE(sim.is_mapped(va + 100, 4 * MiB - 100));
  EXPECT_FALSE(sim.is_mapped(va, 4 * MiB + 1));
  // The same physical memory may be mapped at a second address (an alias).
  sim.map(va + 8 * MiB, 2 * MiB, a, 2 * MiB);
  EXPECT_THROW(sim.release_physical(a), std::logic_error);  // still mapped
  sim.unmap(va, 4 * MiB);
  sim.unmap(va + 8 * MiB, 2 * MiB);
  sim.release_physical(a);
  EXPECT_EQ(sim.physical_bytes(), 0u);
  EXPECT_EQ(sim.peak_physical_bytes(), 6 * MiB);
}

TEST(SimBackend, CatchesCallerBugs) {
  SimBackend sim(sim_options());
  const DevicePtr va = sim.reserve_address(8 * MiB);
  const PhysHandle h = sim.create_physical(2 * MiB);
  sim.map(va, 2 * MiB, h, 0);
  EXPECT_THROW(sim.map(va, 2 * MiB, h, 0), std::logic_error);             // mapped twice
  EXPECT_THROW(sim.unmap(va + 2 * MiB, 2 * MiB), std::logic_error);       // not mapped
  EXPECT_THROW(sim.map(va + 4 * MiB, 4 * MiB, h, 0), std::logic_error);   // beyond chunk
  EXPECT_THROW(sim.map(va + 512, 2 * MiB, h, 0), std::logic_error);       // misaligned
  EXPECT_THROW(sim.map(va + 64 * MiB, 2 * MiB, h, 0), std::logic_error);  // not reserved
  EXPECT_THROW(sim.release_address(va, 8 * MiB), std::logic_error);       // still mapped
  EXPECT_THROW(sim.event_completed(12345), std::logic_error);
  SimBackend::Options o = sim_options();
  o.segments = true;
  SimBackend segments(o);
  EXPECT_THROW(segments.free_segment(12345, 2 * MiB), std::logic_error);  // not a live segment
}

TEST(SimBackend, AWholeChunkMapsAndUnmapsOnlyWhole) {
  SimBackend sim(sim_options());
  const DevicePtr va = sim.reserve_address(16 * MiB);
  const PhysHandle h = sim.create_whole_physical(4 * MiB);
  EXPECT_THROW(sim.map(va, 2 * MiB, h, 0), std::logic_error);  // part of it
  sim.map(va, 4 * MiB, h, 0);
  sim.map(va + 4 * MiB, 4 * MiB, h, 0);  // the same chunk again, right above
  EXPECT_THROW(sim.unmap(va + 2 * MiB, 4 * MiB), std::logic_error);  // half of each mapping
  EXPECT_THROW(sim.unmap(va, 2 * MiB), std::logic_error);
  sim.unmap(va + 4 * MiB, 4 * MiB);  // one whole mapping, though its neighbour is the same chunk
  sim.unmap(va, 4 * MiB);
  sim.release_physical(h);
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

// A grant must cover mapped granules only and cut through no mapping, as cuMemSetAccess needs;
// until then a run mapped without access is not usable.
TEST(SimBackend, AccessIsGrantedOverWholeMappingsOnly) {
  SimBackend sim(sim_options(64 * MiB));
  const DevicePtr va = sim.reserve_address(16 * kGranule);
  const PhysHandle singles = sim.create_physical(3 * kGranule);
  const PhysHandle whole = sim.create_whole_physical(2 * kGranule);
  sim.map(va + 2 * kGranule, 2 * kGranule, whole, 0);
  sim.map_no_access(va, 2 * kGranule, singles, 0);
  EXPECT_FALSE(sim.is_mapped(va, kGranule)) << "mapped without access is not usable yet";
  EXPECT_THROW(sim.set_access(va, 6 * kGranule), std::logic_error);  // granule 5 unmapped
  EXPECT_THROW(sim.set_access(va, 3 * kGranule), std::logic_error);  // half the whole chunk
  sim.set_access(va, 4 * kGranule);
  EXPECT_TRUE(sim.is_mapped(va, 4 * kGranule));
  EXPECT_EQ(sim.set_access_calls(), 1u);
  sim.unmap(va, kGranule);
  EXPECT_FALSE(sim.is_mapped(va, kGranule));
  sim.map_no_access(va, kGranule, singles, 2 * kGranule);
  EXPECT_FALSE(sim.is_mapped(va, kGranule)) << "a new mapping starts without access";
}

TEST(SimBackend, EventsCompleteByLogicalClock) {
  SimBackend sim(sim_options(1 * GiB, 3));
  const EventId e = sim.record_event(7);
  EXPECT_FALSE(sim.event_completed(e));
  sim.advance(2);
  EXPECT_FALSE(sim.event_completed(e));
  sim.advance(1);
  EXPECT_TRUE(sim.event_completed(e));
  const EventId f = sim.record_event(7);
  sim.wait_event(f);  // the host waited: the clock moved on
  EXPECT_TRUE(sim.event_completed(f));
  sim.release_event(e);
  sim.release_event(f);
  EXPECT_EQ(sim.live_events(), 0u);
  EXPECT_THROW(sim.release_event(f), std::logic_error);
}

// A stream told of its work is behind by that work only: an event recorded on it completes
// event_latency ticks after its last work, so one recorded long after the stream went idle
// completes at the next tick; a busy stream's waits the full latency.
TEST(SimBackend, AnIdleStreamCatchesUp) {
  SimBackend sim(sim_options(1 * GiB, 10));
  sim.queue_work(1);  // tick 0
  sim.advance(4);
  sim.queue_work(2);  // tick 4
  const EventId busy = sim.record_event(2);
  const EventId idle = sim.record_event(1);
  const EventId untold = sim.record_event(3);  // never told of work: the plain rule
  EXPECT_FALSE(sim.event_completed(idle)) << "no sooner than the next tick";
  sim.advance(6);  // tick 10: stream 1's work (tick 0) is done
  EXPECT_TRUE(sim.event_completed(idle));
  EXPECT_FALSE(sim.event_completed(busy));
  sim.advance(3);  // tick 13
  EXPECT_FALSE(sim.event_completed(busy));
  EXPECT_FALSE(sim.event_completed(untold));
  sim.advance(1);  // tick 14 = 4 + 10
  EXPECT_TRUE(sim.event_completed(busy));
  EXPECT_TRUE(sim.event_completed(untold));
  sim.advance(50);  // stream 1 long idle
  const EventId later = sim.record_event(1);
  EXPECT_FALSE(sim.event_completed(later));
  sim.advance(1);
  EXPECT_TRUE(sim.event_completed(later)) << "an idle stream's event completes at the next tick";
  for (EventId e : {busy, idle, untold, later}) sim.release_event(e);
}

TEST(SimBackend, IsDeterministic) {
  auto run = [] {
    SimBackend sim(sim_options());
    std::vector<DevicePtr> out;
    for (int i = 0; i < 3; ++i) out.push_back(sim.reserve_address(std::size_t(i + 1) * kGranule));
    return out;
  };
  EXPECT_EQ(run(), run());
}

// A held stream's events stay incomplete until it is released, however far the clock runs, and
// complete at the release whatever the latency; other streams' events are unaffected, and a
// wait completes a held event (the host waited).
TEST(SimBackend, HeldStreamEventsCompleteOnlyAfterRelease) {
  {
    SimBackend::Options o = sim_options();
    o.event_latency = 50;
    SimBackend slow(o);
    slow.hold_stream(3);
    const EventId e = slow.record_event(3);
    slow.advance(1);
    EXPECT_FALSE(slow.event_completed(e));
    slow.release_stream(3);
    EXPECT_TRUE(slow.event_completed(e));  // not 50 ticks after it was recorded
    slow.release_event(e);
  }
  SimBackend sim(sim_options());
  sim.hold_stream(9);
  const EventId held = sim.record_event(9);
  const EventId other = sim.record_event(7);
  sim.advance(100);
  EXPECT_FALSE(sim.event_completed(held));
  EXPECT_TRUE(sim.event_completed(other));
  sim.release_stream(9);
  EXPECT_TRUE(sim.event_completed(held));
  // Released: the stream's new events complete by the clock alone.
  const EventId later = sim.record_event(9);
  EXPECT_FALSE(sim.event_completed(later));
  sim.advance(1);
  EXPECT_TRUE(sim.event_completed(later));
  // Waiting on a held event completes it and moves the clock as for any event.
  sim.hold_stream(9);
  const EventId waited = sim.record_event(9);
  const std::uint64_t before = sim.now();
  sim.wait_event(waited);
  EXPECT_TRUE(sim.event_completed(waited));
  EXPECT_EQ(sim.now(), before + 1);
  sim.release_stream(9);
  sim.release_stream(9);  // not held: nothing changes
  for (EventId e : {held, other, later, waited}) sim.release_event(e);
  EXPECT_EQ(sim.live_events(), 0u);
}

// CUDA's stream waits are transitive: a stream waiting on an event of a stream that had waited
// for a third is ordered after that third's work up to the first wait's event, and no further.
TEST(SimBackend, StreamWaitsAreTransitive) {
  SimBackend sim(SimBackend::Options{});
  sim.advance(5);
  const EventId on3 = sim.record_event(3);  // stream 3's work up to tick 5
  sim.advance(5);
  ASSERT_TRUE(sim.stream_wait_event(1, on3));
  const EventId on1 = sim.record_event(1);
  sim.advance(5);
  const EventId late3 = sim.record_event(3);  // tick 15: after stream 1's event
  ASSERT_TRUE(sim.stream_wait_event(1, late3));
  ASSERT_TRUE(sim.stream_wait_event(2, on1));
  EXPECT_TRUE(sim.waited_for(2, 1, 10));
  EXPECT_TRUE(sim.waited_for(2, 3, 5));
  EXPECT_FALSE(sim.waited_for(2, 3, 15)) << "stream 1 waited for tick 15 only after its event";
  EXPECT_TRUE(sim.waited_for(1, 3, 15));
  for (EventId e : {on3, on1, late3}) sim.release_event(e);
}

// A held stream's release completes its events at once, but not before what the stream had
// been made to wait for: its work still follows the other stream's.
TEST(SimBackend, ReleasingAHeldStreamKeepsItsWaits) {
  SimBackend::Options o;
  o.event_latency = 50;
  SimBackend sim(o);
  sim.hold_stream(2);
  const EventId on0 = sim.record_event(0);  // completes at tick 50
  ASSERT_TRUE(sim.stream_wait_event(2, on0));
  sim.advance(3);
  const EventId on2 = sim.record_event(2);  // held, and after stream 0's event
  sim.advance(5);
  sim.release_stream(2);
  EXPECT_FALSE(sim.event_completed(on2)) << "complete before the event its stream waited for";
  sim.advance(50);
  EXPECT_TRUE(sim.event_completed(on2));
  for (EventId e : {on0, on2}) sim.release_event(e);
}
