// The DeviceBackend contract (cuarena/device_backend.hpp), one typed suite for every backend.
//
// A backend joins with a harness type H and INSTANTIATE_TYPED_TEST_SUITE_P(Name,
// DeviceBackendContract, ::testing::Types<H>, HarnessName). H provides:
//   static constexpr const char* kName;       // the instantiation's name in test names
//   static constexpr bool kMapping;           // supports_mapping()
//   static constexpr bool kEnforcesCapacity;  // refuses memory beyond capacity() itself (the
//                                             // CUDA segment upstreams leave that to the core)
//   static std::string skip_reason();         // "" where it can run (a GPU harness: no device)
//   explicit H(std::size_t capacity);         // a device of `capacity` bytes
//   DeviceBackend& backend();
//   StreamId stream(int i);                   // distinct streams for i = 1, 2, 3
//   void keep_busy(StreamId s);               // s has work pending until the host waits on it
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "cuarena/device_backend.hpp"
#include "cuarena/types.hpp"

namespace cuarena::conformance {

/// Names each instantiation by its harness's kName (Sim/DeviceBackendContract/mapping.X).
struct HarnessName {
  template <class H>
  static std::string GetName(int) {
    return H::kName;
  }
};

template <class H>
class DeviceBackendContract : public ::testing::Test {
 protected:
  static constexpr std::size_t kCapacity = 16 * MiB;  // 8 granules of 2 MiB

  void SetUp() override {
    const std::string why = H::skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    h = std::make_unique<H>(kCapacity);
    g = h->backend().granularity();
    ASSERT_EQ(kCapacity % g, 0u) << "the suite expects 2 MiB granules or smaller";
  }
  DeviceBackend& b() { return h->backend(); }

  std::unique_ptr<H> h;
  std::size_t g = 0;
};

TYPED_TEST_SUITE_P(DeviceBackendContract);

TYPED_TEST_P(DeviceBackendContract, DescribesItself) {
  DeviceBackend& b = this->b();
  const std::size_t g = this->g;
  EXPECT_GE(g, 4096u);
  EXPECT_EQ(g & (g - 1), 0u) << "granularity must be a power of two";
  EXPECT_EQ(b.capacity(), this->kCapacity);
  EXPECT_EQ(b.supports_mapping(), TypeParam::kMapping);
}

// A mapping backend refuses the segment calls and a segment backend the mapping ones.
TYPED_TEST_P(DeviceBackendContract, RefusesTheOtherModesCalls) {
  DeviceBackend& b = this->b();
  if constexpr (TypeParam::kMapping) {
    EXPECT_THROW(b.allocate_segment(this->g, this->h->stream(1)), std::logic_error);
    EXPECT_THROW(b.free_segment(this->g, this->g), std::logic_error);
  } else {
    EXPECT_THROW(b.reserve_address(this->g), std::logic_error);
    EXPECT_THROW(b.create_physical(this->g), std::logic_error);
    EXPECT_THROW(b.map(this->g, this->g, 1, 0), std::logic_error);
    EXPECT_THROW(b.unmap(this->g, this->g), std::logic_error);
  }
}

// Out of memory is 0, not a throw: beyond the whole device always, beyond capacity() where the
// backend keeps the count; freeing makes room again.
TYPED_TEST_P(DeviceBackendContract, OutOfMemoryIsZeroAndFreeingMakesRoom) {
  DeviceBackend& b = this->b();
  const std::size_t g = this->g;
  const std::size_t huge = std::size_t{1} << 50;
  const StreamId s = this->h->stream(1);
  auto take = [&](std::size_t bytes) -> std::uint64_t {
    if constexpr (TypeParam::kMapping) {
      return b.create_physical(bytes);
    } else {
      return b.allocate_segment(bytes, s);
    }
  };
  auto give = [&](std::uint64_t handle, std::size_t bytes) {
    if constexpr (TypeParam::kMapping) {
      (void)bytes;
      b.release_physical(handle);
    } else {
      b.free_segment(handle, bytes);
    }
  };
  EXPECT_EQ(take(huge), 0u);
  const std::size_t n = this->kCapacity / g;
  const std::uint64_t most = take((n - 2) * g);
  ASSERT_NE(most, 0u);
  const std::uint64_t rest = take(2 * g);
  ASSERT_NE(rest, 0u);
  if constexpr (!TypeParam::kMapping) {
    EXPECT_TRUE(rest >= most + (n - 2) * g || rest + 2 * g <= most) << "segments overlap";
  } else {
    EXPECT_NE(rest, most);
  }
  if constexpr (TypeParam::kEnforcesCapacity) {
    EXPECT_EQ(take(g), 0u) << "memory beyond capacity() was handed out";
  }
  give(most, (n - 2) * g);
  const std::uint64_t again = take(4 * g);
  EXPECT_NE(again, 0u) << "freed memory did not make room";
  if (again != 0) give(again, 4 * g);
  give(rest, 2 * g);
  b.trim();
}

TYPED_TEST_P(DeviceBackendContract, ReservesAlignedDisjointRanges) {
  if constexpr (TypeParam::kMapping) {
    DeviceBackend& b = this->b();
    const std::size_t g = this->g;
    const DevicePtr a = b.reserve_address(8 * g);
    const DevicePtr c = b.reserve_address(4 * g);
    EXPECT_NE(a, 0u);
    EXPECT_EQ(a % g, 0u);
    EXPECT_EQ(c % g, 0u);
    EXPECT_TRUE(c >= a + 8 * g || c + 4 * g <= a) << "reservations overlap";
    b.release_address(c, 4 * g);
    b.release_address(a, 8 * g);
  } else {
    SUCCEED() << "a segment backend has no address space (kMapping false)";
  }
}

// Any granule-aligned part of a chunk maps at any reserved address, an alias included; any
// granule-aligned sub-range of what was mapped unmaps on its own; an unmapped range maps again.
TYPED_TEST_P(DeviceBackendContract, MapsAliasesUnmapsPartsAndMapsAgain) {
  if constexpr (TypeParam::kMapping) {
    DeviceBackend& b = this->b();
    const std::size_t g = this->g;
    const DevicePtr va = b.reserve_address(8 * g);
    const PhysHandle chunk = b.create_physical(2 * g);
    ASSERT_NE(chunk, 0u);
    b.map(va, 2 * g, chunk, 0);
    b.map(va + 4 * g, g, chunk, g);  // an alias of the chunk's second granule
    b.unmap(va + g, g);              // part of the first mapping
    b.map(va + g, g, chunk, 0);      // unmapped: maps again (an alias of granule 0)
    b.unmap(va, 2 * g);
    b.unmap(va + 4 * g, g);
    b.map(va, 2 * g, chunk, 0);  // all unmapped: the same addresses map again
    b.unmap(va, 2 * g);
    b.release_physical(chunk);
    b.release_address(va, 8 * g);
  } else {
    SUCCEED() << "a segment backend never maps (kMapping false)";
  }
}

// Runs mapped without access and a whole chunk mapped with it take one grant over all of them;
// a whole chunk maps and unmaps whole, at several addresses.
TYPED_TEST_P(DeviceBackendContract, OneAccessGrantCoversSeveralRuns) {
  if constexpr (TypeParam::kMapping) {
    DeviceBackend& b = this->b();
    const std::size_t g = this->g;
    const DevicePtr va = b.reserve_address(16 * g);
    const PhysHandle singles = b.create_physical(3 * g);
    const PhysHandle whole = b.create_whole_physical(2 * g);
    ASSERT_NE(singles, 0u);
    ASSERT_NE(whole, 0u);
    b.map(va + 2 * g, 2 * g, whole, 0);
    b.map_no_access(va, 2 * g, singles, 0);
    b.map_no_access(va + 4 * g, g, singles, 2 * g);
    b.set_access(va, 5 * g);
    b.map(va + 8 * g, 2 * g, whole, 0);  // the whole chunk again, elsewhere
    b.unmap(va + 8 * g, 2 * g);
    b.unmap(va, 2 * g);
    b.unmap(va + 2 * g, 2 * g);
    b.unmap(va + 4 * g, g);
    b.release_physical(singles);
    b.release_physical(whole);
    b.release_address(va, 16 * g);
  } else {
    SUCCEED() << "a segment backend never maps (kMapping false)";
  }
}

// An event completes once the work queued before it on its own stream has, whatever other
// streams do; wait_event() returns only when it has; a released id may come back.
TYPED_TEST_P(DeviceBackendContract, EventsFollowTheirStream) {
  DeviceBackend& b = this->b();
  const StreamId s = this->h->stream(1), t = this->h->stream(2);
  this->h->keep_busy(s);
  const EventId behind = b.record_event(s);
  const EventId idle = b.record_event(t);
  EXPECT_FALSE(b.event_completed(behind)) << "completed before the work queued ahead of it";
  b.wait_event(idle);
  EXPECT_TRUE(b.event_completed(idle));
  EXPECT_FALSE(b.event_completed(behind)) << "another stream's event completed this one";
  b.wait_event(behind);
  EXPECT_TRUE(b.event_completed(behind)) << "wait_event returned before the event completed";
  b.release_event(behind);
  b.release_event(idle);
  const EventId next = b.record_event(t);
  b.wait_event(next);
  EXPECT_TRUE(b.event_completed(next));
  b.release_event(next);
}

// A stream made to wait for another stream's event runs its later work after that event: an
// event recorded on it after the wait is not complete while the other stream is still busy,
// though the stream itself has no work; a stream not made to wait is unaffected. A backend
// that cannot order streams says so.
TYPED_TEST_P(DeviceBackendContract, StreamWaitsOrderTheWaitingStream) {
  DeviceBackend& b = this->b();
  const StreamId s = this->h->stream(1), t = this->h->stream(2), u = this->h->stream(3);
  this->h->keep_busy(s);
  const EventId busy = b.record_event(s);
  if (!b.supports_stream_waits()) {
    EXPECT_FALSE(b.stream_wait_event(t, busy));
    b.wait_event(busy);
    b.release_event(busy);
    return;
  }
  ASSERT_TRUE(b.stream_wait_event(t, busy));
  const EventId after = b.record_event(t);
  const EventId other = b.record_event(u);
  b.wait_event(other);
  EXPECT_TRUE(b.event_completed(other));
  EXPECT_FALSE(b.event_completed(after)) << "the waiting stream ran ahead of the event";
  b.wait_event(after);
  EXPECT_TRUE(b.event_completed(after));
  b.wait_event(busy);
  for (EventId e : {busy, after, other}) b.release_event(e);
}

REGISTER_TYPED_TEST_SUITE_P(DeviceBackendContract, DescribesItself, RefusesTheOtherModesCalls,
                            OutOfMemoryIsZeroAndFreeingMakesRoom, ReservesAlignedDisjointRanges,
                            MapsAliasesUnmapsPartsAndMapsAgain, OneAccessGrantCoversSeveralRuns,
                            EventsFollowTheirStream, StreamWaitsOrderTheWaitingStream);

}  // namespace cuarena::conformance
