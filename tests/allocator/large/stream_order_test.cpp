// Stream-ordered reuse: a free on S is reusable by S at once, by other streams only after an
// event recorded on S after the free has completed.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

// Forwards to a SimBackend and remembers which physical granule backs each virtual granule, so a
// test can ask which physical memory two blocks share.
class TrackingBackend final : public ForwardingBackend {
 public:
  explicit TrackingBackend(SimBackend& sim) : ForwardingBackend(sim) {}
  void map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) override {
    sim_.map(va, bytes, chunk, offset);
    track(va, bytes, chunk, offset);
  }
  void map_no_access(DevicePtr va, std::size_t bytes, PhysHandle chunk,
                     std::size_t offset) override {
    sim_.map_no_access(va, bytes, chunk, offset);
    track(va, bytes, chunk, offset);
  }
  void unmap(DevicePtr va, std::size_t bytes) override {
    sim_.unmap(va, bytes);
    for (std::size_t i = 0; i < bytes; i += granularity()) phys_.erase(va + i);
  }
  EventId record_event(StreamId s) override {
    ++records;
    return sim_.record_event(s);
  }
  bool event_completed(EventId e) override {
    ++queries;
    return sim_.event_completed(e);
  }

  /// Physical granules (chunk, byte offset) behind [p, p+bytes).
  std::set<std::pair<PhysHandle, std::size_t>> physical(void* p, std::size_t bytes) const {
    std::set<std::pair<PhysHandle, std::size_t>> out;
    const std::size_t g = granularity();
    const DevicePtr lo = addr(p) / g * g;
    for (DevicePtr va = lo; va < addr(p) + bytes; va += g) out.insert(phys_.at(va));
    return out;
  }

  int records = 0;  ///< record_event() calls
  int queries = 0;  ///< event_completed() calls

 private:
  void track(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) {
    for (std::size_t i = 0; i < bytes; i += granularity()) phys_[va + i] = {chunk, offset + i};
  }
  std::map<DevicePtr, std::pair<PhysHandle, std::size_t>> phys_;
};

bool share(const std::set<std::pair<PhysHandle, std::size_t>>& a,
           const std::set<std::pair<PhysHandle, std::size_t>>& b) {
  for (const auto& x : a) {
    if (b.count(x)) return true;
  }
  return false;
}

constexpr std::uint64_t kSlow = 1000;  // event latency in ticks: the device lags far behind

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
  EXPECT_EQ(s.allocated_bytes[0].current, 0);                   // freed for the program
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

// Stream 1 frees two 2 MiB blocks around a live one while the device lags far behind.
struct TwoFreedGranules : ::testing::Test {
  explicit TwoFreedGranules(const char* config = "small_limit:512")
      : a(tracking, Config::parse(config)) {
    void* a1 = a.allocate(2 * MiB, 1);
    pin = a.allocate(2 * MiB, 1);
    void* a2 = a.allocate(2 * MiB, 1);
    freed = tracking.physical(a1, 2 * MiB);
    for (const auto& x : tracking.physical(a2, 2 * MiB)) freed.insert(x);
    a.deallocate(a1);
    a.deallocate(a2);
  }
  SimBackend sim{sim_options(1 * GiB, kSlow)};
  TrackingBackend tracking{sim};
  Allocator a;
  void* pin = nullptr;
  std::set<std::pair<PhysHandle, std::size_t>> freed;  // the freed blocks' physical granules
};

// Regression: an alias of stream 1's freed memory once landed in a granule that stuck out of
// the new block into a shared free neighbour, which stream 2 then got at once.
TEST_F(TwoFreedGranules, AliasesNeverReachAnotherStreamEarly) {
  void* b = a.allocate(3 * MiB, 1);      // fits no owned block: aliases stream 1's granules
  void* c = a.allocate(3 * MiB / 2, 2);  // another stream, before any event completed
  EXPECT_FALSE(share(tracking.physical(c, 3 * MiB / 2), freed))
      << "stream 2 got memory stream 1 freed before stream 1's event completed";
  a.check_invariants();
  for (void* p : {pin, b, c}) a.deallocate(p);
}

// Without device waits between streams (internal_dependencies off), so that stream 2 can only
// grow or wait.
struct TwoFreedGranulesNoDeviceWaits : TwoFreedGranules {
  TwoFreedGranulesNoDeviceWaits()
      : TwoFreedGranules("small_limit:512,internal_dependencies:False") {}
};

// b's granule that sticks out of it takes an alias too (no growth), and the free rest of that
// granule becomes stream 1's, freed now: stream 1 may use it at once, stream 2 only after
// stream 1's event.
TEST_F(TwoFreedGranulesNoDeviceWaits, AnEdgeGranuleTakesAnAliasAndItsRestStaysWithTheStream) {
  const std::size_t before = sim.physical_bytes();
  void* b = a.allocate(3 * MiB, 1);  // two granules, one sticking out: both aliased
  EXPECT_EQ(sim.physical_bytes(), before) << "the edge granule was created, not aliased";
  EXPECT_EQ(a.stats().granules_aliased, 2);
  a.check_invariants();
  const DevicePtr edge = (addr(b) + 3 * MiB) / (2 * MiB) * (2 * MiB);  // b's last granule
  void* c = a.allocate(1 * MiB, 2);  // stream 2 may not have the rest of it yet
  EXPECT_FALSE(share(tracking.physical(c, 1 * MiB), freed))
      << "stream 2 got memory stream 1 freed before stream 1's event completed";
  void* d = a.allocate(1 * MiB, 1);  // stream 1 may
  EXPECT_EQ(addr(d), addr(b) + 3 * MiB) << "stream 1 could not use the rest of b's last granule";
  EXPECT_EQ(addr(d) / (2 * MiB) * (2 * MiB), edge);
  a.check_invariants();
  for (void* p : {pin, b, c, d}) a.deallocate(p);
  sim.advance(kSlow);
  a.check_invariants();
}

// With device waits (the default), stream 2 takes that rest rather than grow, and only ordered
// after stream 1's work up to now.
TEST_F(TwoFreedGranules, AnotherStreamTakesTheEdgeGranulesRestOnlyOrderedAfterTheOwner) {
  const std::uint64_t freed_at = sim.now();
  void* b = a.allocate(3 * MiB, 1);
  const std::size_t before = sim.physical_bytes();
  EXPECT_FALSE(sim.waited_for(2, 1, freed_at));
  void* c = a.allocate(1 * MiB, 2);
  EXPECT_EQ(sim.physical_bytes(), before) << "stream 2 grew instead of taking stream 1's rest";
  EXPECT_TRUE(share(tracking.physical(c, 1 * MiB), freed));
  EXPECT_TRUE(sim.waited_for(2, 1, freed_at))
      << "stream 2 got memory stream 1 freed without being ordered after stream 1";
  EXPECT_EQ(a.stats().grow_stream_waits, 1);
  a.check_invariants();
  for (void* p : {pin, b, c}) a.deallocate(p);
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

// internal_dependencies: the same request of stream 2 takes stream 1's unswept block instead of
// growing, and stream 2 is made to wait on the device for stream 1's work up to then; the host
// waits for nothing. Without a backend able to order streams it grows as above.
TEST(StreamOrder, InternalDependenciesTakeAnotherStreamsFreeWithADeviceWait) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512,sweep_interval:1,internal_dependencies:True"));
  void* p = a.allocate(64 * MiB, 1);
  const std::uint64_t freed_at = sim.now();
  a.deallocate(p);
  EXPECT_FALSE(sim.waited_for(2, 1, freed_at));
  void* q = a.allocate(60 * MiB, 2);
  EXPECT_EQ(sim.physical_bytes(), 64 * MiB) << "grew instead of taking stream 1's free";
  EXPECT_EQ(q, p);
  EXPECT_TRUE(sim.waited_for(2, 1, freed_at)) << "stream 2 reuses stream 1's bytes unordered";
  EXPECT_EQ(a.stats().grow_stream_waits, 1);
  EXPECT_EQ(a.stats().grow_waits, 0);
  // A request mapped memory serves (stream 2's own free) makes no wait.
  a.deallocate(q);
  void* r = a.allocate(60 * MiB, 2);
  EXPECT_EQ(a.stats().grow_stream_waits, 1);
  a.deallocate(r);
  a.check_invariants();
}

// A stream under graph capture is neither made to wait nor has an event recorded on it (the
// simulator throws on either): a request there, or one that would take a captured stream's free,
// grows instead; once the capture ends the free is taken with a wait as above.
TEST(StreamOrder, InternalDependenciesPassOverStreamsUnderCapture) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512,sweep_interval:1,internal_dependencies:True"));
  void* p = a.allocate(64 * MiB, 1);
  const std::uint64_t freed_at = sim.now();
  a.deallocate(p);
  sim.begin_capture(1);  // the owner captured
  void* q = a.allocate(60 * MiB, 2);
  EXPECT_NE(q, p);
  EXPECT_GE(sim.physical_bytes(), 124 * MiB) << "took the captured stream's free";
  EXPECT_EQ(a.stats().grow_stream_waits, 0);
  sim.end_capture(1);
  sim.begin_capture(3);  // the requester captured
  void* r = a.allocate(60 * MiB, 3);
  EXPECT_NE(r, p);
  EXPECT_EQ(a.stats().grow_stream_waits, 0);
  sim.end_capture(3);
  EXPECT_FALSE(sim.waited_for(4, 1, freed_at));
  void* t = a.allocate(60 * MiB, 4);
  EXPECT_EQ(t, p) << "the free stayed stream 1's after the capture";
  EXPECT_TRUE(sim.waited_for(4, 1, freed_at));
  EXPECT_EQ(a.stats().grow_stream_waits, 1);
  for (void* x : {q, r, t}) a.deallocate(x);
  a.check_invariants();
}

// allocate_isolated() (a private pool's segment, handed on to streams the allocator never sees)
// never takes another stream's unreached free: no device wait could order those streams.
TEST(StreamOrder, AnIsolatedRequestGrowsRatherThanWaitOnTheDevice) {
  SimBackend sim(sim_options(1 * GiB, kSlow));
  Allocator a(sim, Config::parse("small_limit:512,sweep_interval:1"));
  void* p = a.allocate(64 * MiB, 1);
  const std::uint64_t freed_at = sim.now();
  a.deallocate(p);
  void* q = a.allocate_isolated(60 * MiB, 2);
  EXPECT_NE(q, p);
  EXPECT_FALSE(sim.waited_for(2, 1, freed_at));
  EXPECT_EQ(a.stats().grow_stream_waits, 0);
  a.deallocate(q);
  void* r = a.allocate_isolated(60 * MiB, 2);  // its own stream's free: at once
  EXPECT_EQ(r, q);
  a.deallocate(r);
  a.check_invariants();
}

// A sweep over every stream (process_events(), a defragmentation, a synchronisation) passes over
// a stream under graph capture and covers its frees once the capture has ended.
TEST(StreamOrder, SweepsWaitForACaptureToEnd) {
  SimBackend sim(sim_options(1 * GiB, 1));
  Allocator a(sim, Config::parse("small_limit:512,sweep_interval:1000"));
  void* p = a.allocate(64 * MiB, 1);
  a.deallocate(p);  // no sweep yet (sweep_interval)
  sim.begin_capture(1);
  ASSERT_NO_THROW(a.process_events());
  sim.advance(2);
  ASSERT_NO_THROW(a.process_events());
  void* q = a.allocate(60 * MiB, 2);
  EXPECT_NE(q, p) << "shared without a sweep";
  sim.end_capture(1);
  a.process_events();  // records the sweep now
  sim.advance(2);
  a.process_events();  // and shares what it covers
  EXPECT_EQ(a.memory_breakdown().owned_cached, 0u);
  for (void* x : {q}) a.deallocate(x);
  a.check_invariants();
}

// Frees share lazily: a free's check leaves its poll, and the sharing of what completed, owed to
// the next request (or to a free beside a block it may cover). The tests free, on stream 1, blocks
// laid out p[0] | p[1] | ... so that a later free lands between blocks whose sharing is owed; every
// 2nd free checks the sweeps.
struct OwedSharing : ::testing::Test {
  static constexpr std::size_t kBlock = 2 * MiB;
  // Own-first placement needs whole chunks: memory first always places unified.
  explicit OwedSharing(const char* placement = "whole_chunk_min:4MiB,placement:own_first")
      : a{sim, Config::parse(std::string("small_limit:512,sweep_interval:2,") + placement)} {}
  SimBackend sim{sim_options(1 * GiB, 1)};
  Allocator a;
  std::vector<void*> p;

  void SetUp() override {
    for (int i = 0; i < 6; ++i) p.push_back(a.allocate(kBlock, 1));
    for (int i = 1; i < 6; ++i)
      ASSERT_EQ(addr(p[i]), addr(p[i - 1]) + kBlock) << "the test needs adjacent blocks";
    a.deallocate(p[0]);
    a.deallocate(p[2]);  // 2nd free: a sweep covering p[0] and p[2] is recorded
    sim.advance(1);      // ... and completes
    a.deallocate(p[5]);
    a.deallocate(p[4]);  // 4th free: polling the sweep, and sharing p[0], p[2], is owed
    a.check_invariants();
  }
};

TEST_F(OwedSharing, AFreeBesideBlocksOwedSharingLeavesThemToBeShared) {
  a.deallocate(p[1]);  // between p[0] and p[2]: absorbing them would keep them owned
  a.check_invariants();
  const Allocator::MemoryBreakdown m = a.memory_breakdown();
  // As if shared at the 4th free: p[0] and p[2] shared; p[1] and p[4]+p[5] owned.
  EXPECT_EQ(m.owned_cached, 3 * kBlock);
  EXPECT_GE(m.shared_cached, 2 * kBlock);
  a.deallocate(p[3]);
}

// Placed unified, a free absorbs the shared neighbours its stream used: one beside blocks owed
// sharing settles first and absorbs them, as if they had been shared at the 4th free.
struct OwedSharingUnified : OwedSharing {
  OwedSharingUnified() : OwedSharing("placement:unified") {}
};

TEST_F(OwedSharingUnified, AFreeBesideBlocksOwedSharingAbsorbsThem) {
  // The 4th free left its poll to the next request: p[0], p[2] read owned until polled.
  EXPECT_EQ(a.memory_breakdown().owned_cached, 4 * kBlock);
  a.deallocate(p[1]);
  a.check_invariants();
  const Allocator::MemoryBreakdown m = a.memory_breakdown();
  EXPECT_EQ(m.owned_cached, 5 * kBlock) << "p[1] did not absorb p[0] and p[2]";
  EXPECT_EQ(m.shared_cached, 0u);
  a.deallocate(p[3]);
  a.check_invariants();
}

TEST_F(OwedSharingUnified, ARequestSeesWhatTheFreesLeftOwed) {
  void* q = a.allocate(kBlock, 2);
  EXPECT_TRUE(q == p[0] || q == p[2]) << "stream 2 did not get a block the sweep shared";
  a.check_invariants();
  for (void* x : {q, p[1], p[3]}) a.deallocate(x);
}

// The free that checks a stream's sweeps records one and leaves the poll of those in flight to
// the next request: no event query on the free path.
TEST(SweepCheck, TheCheckingFreeRecordsAndTheNextRequestPolls) {
  SimBackend sim(sim_options(1 * GiB, 1));
  TrackingBackend backend(sim);
  Allocator a(backend, Config::parse("small_limit:512,sweep_interval:2"));
  std::vector<void*> p;
  for (int i = 0; i < 8; ++i) p.push_back(a.allocate(2 * MiB, 1));
  // Free every other block: the live ones between keep the frees from coalescing.
  a.deallocate(p[0]);
  a.deallocate(p[2]);  // 2nd free: records a sweep covering p[0] and p[2]
  sim.advance(1);      // ... which completes
  a.deallocate(p[4]);
  const int queries = backend.queries, records = backend.records;
  a.deallocate(p[6]);  // 4th free: records the next sweep, polls nothing
  EXPECT_EQ(backend.queries, queries) << "the checking free queried an event";
  EXPECT_EQ(backend.records, records + 1);
  EXPECT_EQ(a.memory_breakdown().shared_cached, 0u) << "shared before any request polled";
  a.check_invariants();
  void* q = a.allocate(2 * MiB, 2);  // the request polls: the first sweep completed
  EXPECT_GT(backend.queries, queries);
  EXPECT_TRUE(q == p[0] || q == p[2]) << "stream 2 did not get a block the sweep shared";
  a.check_invariants();
  for (void* x : {q, p[1], p[3], p[5], p[7]}) a.deallocate(x);
}

TEST_F(OwedSharing, ARequestSeesWhatTheFreesLeftOwed) {
  const std::int64_t before = reserved(a);
  void* q = a.allocate(kBlock, 2);  // stream 2 owns nothing: only a shared block serves it
  EXPECT_TRUE(q == p[0] || q == p[2]) << "stream 2 did not get a block the sweep shared";
  EXPECT_EQ(a.stats().cross_stream_reuses, 1);
  EXPECT_EQ(reserved(a), before);
  a.check_invariants();
  for (void* x : {q, p[1], p[3]}) a.deallocate(x);
}

// Readers (statistics, snapshots) do not settle owed sharing (own-first placement): they never call
// the device. Here the sharing owed drops an alias, which with dormant_maps:0 unmaps.
TEST(OwedSharingReaders, MakeNoDriverCall) {
  SimBackend::Options o = sim_options(64 * MiB, 1);
  SimBackend sim(o);
  Allocator a(sim, Config::parse("dormant_maps:0,sweep_interval:1,small_limit:512,"
                                 "whole_chunk_fraction:1,placement:own_first"));
  void* x = a.allocate(4 * MiB, 1);
  void* c = a.allocate(4 * MiB, 1);
  void* d = a.allocate(4 * MiB, 1);
  a.deallocate(x);
  void* b = a.allocate(8 * MiB, 1);  // no own fit: takes x's granules as aliases
  ASSERT_GT(a.stats().granules_aliased, 0) << "the test needs an alias to drop";
  sim.advance(5);
  a.deallocate(c);  // records a sweep covering x's retired range
  sim.advance(5);
  a.deallocate(d);  // finds it completed: dropping the alias is owed
  const std::size_t unmaps = sim.unmap_calls();
  a.stats();
  a.memory_breakdown();
  a.fragmentation();
  a.segments();
  EXPECT_EQ(sim.unmap_calls(), unmaps) << "a reader called the device";
  a.check_invariants();
  void* e = a.allocate(2 * MiB, 2);  // a request settles: the alias goes
  EXPECT_GT(sim.unmap_calls(), unmaps);
  for (void* p : {b, e}) a.deallocate(p);
}

}  // namespace
