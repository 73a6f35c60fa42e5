// Stream-ordered reuse: a free on S is reusable by S at once, by other streams only after an
// event recorded on S after the free has completed.
#include <gtest/gtest.h>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

constexpr std::uint64_t kSlow = 1000;  // event latency in ticks: the device lags far behind

TEST(StreamOrder, OtherStreamWaitsForTheEvent) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512"));
  void* p = a.allocate(8 * MiB, 1);
  a.deallocate(p);
  void* q = a.allocate(8 * MiB, 2);
  EXPECT_NE(q, p) << "stream 2 reused stream 1's block before its event completed";
  sim.advance(kSlow);
  void* r = a.allocate(8 * MiB, 2);
  EXPECT_EQ(r, p) << "after the event completed stream 2 should reuse the block";
  EXPECT_EQ(a.stats().cross_stream_reuses, 1);
  a.deallocate(q);
  a.deallocate(r);
  a.check_invariants();
}

TEST(StreamOrder, SmallBlocksStayWithTheirStream) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim);
  void* p = a.allocate(1000, 1);
  a.deallocate(p);
  void* q = a.allocate(1000, 2);
  EXPECT_NE(q, p);
  EXPECT_EQ(a.allocate(1000, 1), p);
}

TEST(StreamOrder, RecordStreamDelaysReuseUntilEveryStreamIsDone) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512"));
  void* p = a.allocate(4 * MiB, 1);
  a.record_stream(p, 2);
  a.record_stream(p, 2);  // repeated: recorded once
  a.record_stream(p, 1);  // its own stream: no-op
  a.deallocate(p);
  Stats s = a.stats();
  EXPECT_EQ(s.pending_frees, 1);
  EXPECT_EQ(s.allocated_bytes[0].current, 0);                    // freed for the program
  EXPECT_EQ(s.active_bytes[0].current, std::int64_t(4 * MiB));  // but still active
  void* q = a.allocate(4 * MiB, 1);
  EXPECT_NE(q, p) << "reused while stream 2 may still be using it";
  a.deallocate(q);
  sim.advance(kSlow);
  a.process_events();
  EXPECT_EQ(a.stats().pending_frees, 0);
  EXPECT_EQ(a.stats().active_bytes[0].current, 0);
  EXPECT_GE(a.stats().events_recorded, 1);
  a.check_invariants();
}

TEST(StreamOrder, SameStreamReusesPhysicalMemoryAtOnceByAliasing) {
  // 64 MiB freed on stream 1, then 96 MiB asked on stream 1 while the device lags: the freed
  // granules are mapped under the new block at once (stream order makes that safe), so only
  // 32 MiB is new. Another stream must not get them.
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512"));
  void* p = a.allocate(64 * MiB, 1);
  a.deallocate(p);
  void* q = a.allocate(96 * MiB, 1);
  EXPECT_EQ(sim.physical_bytes(), 96 * MiB);
  EXPECT_EQ(a.stats().granules_aliased, 32);
  a.check_invariants();
  void* r = a.allocate(64 * MiB, 2);
  EXPECT_EQ(sim.physical_bytes(), 160 * MiB) << "stream 2 got stream 1's memory too early";
  // Once stream 1's event completes the old addresses are unmapped and reusable by anyone.
  sim.advance(kSlow);
  a.deallocate(r);
  a.deallocate(q);
  a.check_invariants();
}

TEST(StreamOrder, WithoutAliasingTheStreamWaitsForItsEvent) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512,stream_alias:False"));
  void* p = a.allocate(64 * MiB, 1);
  a.deallocate(p);
  void* q = a.allocate(96 * MiB, 1);
  EXPECT_EQ(sim.physical_bytes(), 160 * MiB);
  EXPECT_EQ(a.stats().granules_aliased, 0);
  a.deallocate(q);
}

TEST(StreamOrder, CrossStreamStealingWaitsForTheEvent) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512,sweep_interval:1"));
  void* p = a.allocate(64 * MiB, 1);
  a.deallocate(p);  // a sweep event is recorded now
  void* q = a.allocate(80 * MiB, 2);
  EXPECT_EQ(sim.physical_bytes(), 144 * MiB);
  sim.advance(kSlow);
  void* r = a.allocate(60 * MiB, 2);  // the 64 MiB block is shared now: no growth
  EXPECT_EQ(sim.physical_bytes(), 144 * MiB);
  a.deallocate(q);
  a.deallocate(r);
  a.check_invariants();
}

}  // namespace
