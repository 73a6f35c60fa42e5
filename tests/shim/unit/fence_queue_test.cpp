// The shim's fenced synchronous frees (shim/src/fence_queue.cpp, stream_registry.cpp) over a fake
// driver: a block comes back only once every event of its fence has completed (the legacy
// stream's excepted when stream order covers it), never twice, and the byte counts the pacing
// relies on stay exact.
#include "fence_queue.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "fake_driver.hpp"
#include "stream_registry.hpp"

using namespace cuarena;
using namespace cuarena::shim;

namespace {
CUstream stream(std::uintptr_t id) { return reinterpret_cast<CUstream>(id); }  // odd: non-blocking
}  // namespace

TEST(StreamRegistry, OneEventOnTheLegacyStreamAndOneForEachNonBlockingStream) {
  StreamRegistry r;
  r.add(stream(0x11), false);  // non-blocking
  r.add(stream(0x20), false);  // blocking: covered by the legacy stream's event
  r.add(stream(0x11), true);   // seen again: still one
  r.add(nullptr, true);        // default streams are not tracked
  FenceEvents events;
  ASSERT_TRUE(r.record_fence(events));
  EXPECT_TRUE(events.legacy);
  EXPECT_EQ(events.others.size(), 1u);
  fake::g_capturing = true;
  FenceEvents none;
  EXPECT_FALSE(r.record_fence(none)) << "no event while a stream captures a graph";
  EXPECT_FALSE(none.legacy);
  EXPECT_TRUE(none.others.empty());
  fake::g_capturing = false;
}

TEST(StreamRegistry, UsedStreamsAreParkedAndReusedOthersRetiredWithTheirLastEvent) {
  StreamRegistry r;
  r.add(stream(0x31), true);   // cuarena allocated on it
  r.add(stream(0x41), false);  // never used by cuarena
  EXPECT_FALSE(r.retire(stream(0x31))) << "a stream cuarena used must not be destroyed";
  EXPECT_TRUE(r.retire(stream(0x41)));
  EXPECT_EQ(r.reuse(CU_STREAM_NON_BLOCKING, 0), stream(0x31));
  EXPECT_EQ(r.reuse(CU_STREAM_NON_BLOCKING, 0), nullptr) << "handed back once";
  // The retired stream's last event is in every fence until it completes.
  FenceEvents events;
  ASSERT_TRUE(r.record_fence(events));
  EXPECT_EQ(events.others.size(), 2u);  // 0x31 (live again), 0x41's last event
  fake::complete(events.others[1].get());
  FenceEvents later;
  ASSERT_TRUE(r.record_fence(later));
  EXPECT_EQ(later.others.size(), 1u) << "a completed retired event is dropped";
}

TEST(StreamRegistry, ANonBlockingStreamNewToTheProgramWaitsForTheNewestFence) {
  StreamRegistry r;
  fake::g_waits.clear();
  r.add(stream(0x71), false);
  EXPECT_TRUE(fake::g_waits.empty()) << "no fence yet: nothing to wait for";
  EXPECT_TRUE(r.has_live_non_blocking());
  EXPECT_TRUE(r.retire(stream(0x71))) << "never used by cuarena: destroyed for real";
  EXPECT_FALSE(r.has_live_non_blocking());
  r.add(stream(0x80), false);  // blocking: ordered by the legacy stream already
  EXPECT_FALSE(r.has_live_non_blocking());
  FenceEvents first, second;
  ASSERT_TRUE(r.record_fence(first));
  ASSERT_TRUE(r.record_fence(second));
  r.add(stream(0x91), true);
  ASSERT_EQ(fake::g_waits.size(), 1u);
  EXPECT_EQ(fake::g_waits[0].first, stream(0x91));
  EXPECT_EQ(fake::g_waits[0].second, second.legacy.get()) << "the newest fence's legacy event";
  // A parked stream handed back is new to the program too.
  EXPECT_FALSE(r.retire(stream(0x91)));
  EXPECT_FALSE(r.has_live_non_blocking()) << "a parked stream gets no new work";
  FenceEvents third;
  ASSERT_TRUE(r.record_fence(third));
  EXPECT_EQ(r.reuse(CU_STREAM_NON_BLOCKING, 0), stream(0x91));
  ASSERT_EQ(fake::g_waits.size(), 2u);
  EXPECT_EQ(fake::g_waits[1].second, third.legacy.get());
  EXPECT_TRUE(r.has_live_non_blocking());
}

TEST(FenceQueue, StreamOrderReleasesAtOnceButStillWaitsForNonBlockingStreams) {
  StreamRegistry r;
  FenceQueue q;
  std::vector<FenceQueue::Freed> out;
  ASSERT_TRUE(q.defer(0x1000, 512));
  FenceEvents only_legacy;
  ASSERT_TRUE(r.record_fence(only_legacy));
  FenceEvent legacy = only_legacy.legacy;
  q.close(std::move(only_legacy));
  q.take_completed(out, false);
  EXPECT_TRUE(out.empty()) << "without stream order the legacy event must complete";
  q.take_completed(out, true);
  ASSERT_EQ(out.size(), 1u) << "stream order covers the legacy event";
  EXPECT_FALSE(fake::completed(legacy.get()));

  r.add(stream(0xa1), false);  // a non-blocking stream: its event must complete regardless
  ASSERT_TRUE(q.defer(0x2000, 512));
  FenceEvents both;
  ASSERT_TRUE(r.record_fence(both));
  FenceEvent side = both.others.at(0);
  q.close(std::move(both));
  out.clear();
  q.take_completed(out, true);
  EXPECT_TRUE(out.empty());
  fake::complete(side.get());
  q.take_completed(out, true);
  EXPECT_EQ(out.size(), 1u);
}

TEST(FenceQueue, BlocksComeBackOnlyAfterEveryEventOfTheirFence) {
  StreamRegistry r;
  r.add(stream(0x51), false);
  FenceQueue q;
  ASSERT_TRUE(q.defer(0x1000, 512));
  ASSERT_TRUE(q.defer(0x2000, 1024));
  EXPECT_FALSE(q.defer(0x1000, 512)) << "a double free is refused";
  EXPECT_EQ(q.outstanding_bytes(), 1536u);
  FenceEvents events;
  ASSERT_TRUE(r.record_fence(events));
  ASSERT_EQ(events.others.size(), 1u);
  const FenceEvents held = events;
  q.close(std::move(events));
  std::vector<FenceQueue::Freed> out;
  q.take_completed(out, false);
  EXPECT_TRUE(out.empty());
  fake::complete(held.others[0].get());
  q.take_completed(out, false);
  EXPECT_TRUE(out.empty()) << "one event of two done is not enough";
  fake::complete(held.legacy.get());
  q.take_completed(out, false);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(q.outstanding_bytes(), 0u);
  EXPECT_FALSE(q.waiting(0x1000));
  EXPECT_TRUE(q.defer(0x1000, 512)) << "freed again after its reuse";
}

TEST(FenceQueue, ARefusedWaitKeepsTheFence) {
  StreamRegistry r;
  FenceQueue q;
  ASSERT_TRUE(q.defer(0x3000, 512));
  FenceEvents events;
  ASSERT_TRUE(r.record_fence(events));
  q.close(std::move(events));
  std::vector<FenceQueue::Freed> out;
  fake::g_sync_refused = true;
  EXPECT_FALSE(q.wait_oldest(out, false)) << "a wait the driver refused proves nothing";
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(q.waiting(0x3000));
  EXPECT_EQ(q.outstanding_bytes(), 512u);
  fake::g_sync_refused = false;
  EXPECT_TRUE(q.wait_oldest(out, false));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ptr, DevicePtr{0x3000});
}

TEST(StreamRegistry, ACaptureAnywhereIsSeen) {
  StreamRegistry r;
  EXPECT_FALSE(r.any_capturing());
  fake::g_capturing = true;
  EXPECT_TRUE(r.any_capturing()) << "the legacy stream's answer covers blocking streams";
  fake::g_capturing = false;
  // Captures the hooks counted, with no driver query saying so.
  r.capture_begins(stream(0xb1));
  r.capture_begins(stream(0xc1));
  EXPECT_TRUE(r.any_capturing());
  r.capture_ends(stream(0xb1));
  EXPECT_TRUE(r.any_capturing()) << "0xc1 still captures";
  r.capture_ends(stream(0xd1));  // never began: no effect
  EXPECT_TRUE(r.any_capturing());
  r.capture_ends(stream(0xc1));
  EXPECT_FALSE(r.any_capturing());
  FenceEvents events;
  r.capture_begins(stream(0xb1));
  EXPECT_FALSE(r.record_fence(events)) << "no fence during a counted capture";
  r.capture_ends(stream(0xb1));
  EXPECT_TRUE(r.record_fence(events));
}

TEST(StreamRegistry, AnIdleNonBlockingStreamNeedsNoEvent) {
  StreamRegistry r;
  r.add(stream(0xe1), false);
  r.add(stream(0xf1), false);
  fake::g_idle = {stream(0xe1)};
  FenceEvents events;
  ASSERT_TRUE(r.record_fence(events));
  EXPECT_EQ(events.others.size(), 1u) << "only the busy stream is fenced";
  fake::g_idle.clear();
}

TEST(FenceQueue, RandomizedAgainstAModel) {
  std::mt19937_64 rng(20261201);
  StreamRegistry r;
  for (std::uintptr_t s = 0x61; s < 0x61 + 2 * 4; s += 2) r.add(stream(s), true);
  FenceQueue q;
  struct ModelFence {
    FenceEvents events;
    std::vector<DevicePtr> ptrs;
  };
  std::vector<ModelFence> fences;  // closed, not yet taken, oldest first
  std::vector<DevicePtr> open;
  std::map<DevicePtr, std::size_t> bytes;  // waiting pointers
  std::set<DevicePtr> live;                // allocated and not freed
  DevicePtr next = 0x10000;
  std::size_t released = 0;
  std::size_t expect = 0;  // bytes of the waiting pointers
  auto check_out = [&](const std::vector<FenceQueue::Freed>& out, bool legacy_orders) {
    for (const FenceQueue::Freed& f : out) {
      // It must come from the oldest fences, all of whose events are done.
      auto it = std::find_if(fences.begin(), fences.end(), [&](const ModelFence& m) {
        return std::find(m.ptrs.begin(), m.ptrs.end(), f.ptr) != m.ptrs.end();
      });
      ASSERT_NE(it, fences.end()) << "released a pointer no closed fence holds";
      for (const FenceEvent& e : it->events.others)
        ASSERT_TRUE(fake::completed(e.get())) << "released early";
      if (!legacy_orders) {
        ASSERT_TRUE(fake::completed(it->events.legacy.get())) << "released before the legacy event";
      }
      ASSERT_EQ(bytes.at(f.ptr), f.bytes);
      expect -= f.bytes;
      bytes.erase(f.ptr);
      it->ptrs.erase(std::find(it->ptrs.begin(), it->ptrs.end(), f.ptr));
      if (it->ptrs.empty()) fences.erase(it);
      live.insert(f.ptr);  // back to the allocator: the program may get it again
      ++released;
    }
  };
  for (int op = 0; op < 100000; ++op) {
    const int what = int(rng() % 10);
    if (what < 3 && live.size() < 256) {  // allocate
      live.insert(next);
      next += 512 * (1 + rng() % 64);
    } else if (what < 6 && !live.empty()) {  // free a live pointer
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const DevicePtr p = *it;
      const std::size_t b = 512 * (1 + rng() % 8);
      ASSERT_TRUE(q.defer(p, b));
      ASSERT_FALSE(q.defer(p, b));
      live.erase(it);
      open.push_back(p);
      bytes[p] = b;
      expect += b;
    } else if (what == 6 && !open.empty()) {  // close the batch
      FenceEvents events;
      ASSERT_TRUE(r.record_fence(events));
      fences.push_back({events, open});
      open.clear();
      q.close(std::move(events));
    } else if (what == 7 && !fences.empty()) {  // the device reaches some recorded point
      ModelFence& f = fences[rng() % fences.size()];
      const std::size_t i = rng() % (f.events.others.size() + 1);
      fake::complete(i == 0 ? f.events.legacy.get() : f.events.others[i - 1].get());
    } else if (what == 8) {
      std::vector<FenceQueue::Freed> out;
      const bool legacy_orders = rng() % 4 == 0;
      q.take_completed(out, legacy_orders);
      check_out(out, legacy_orders);
    } else if (what == 9 && rng() % 8 == 0) {
      std::vector<FenceQueue::Freed> out;
      const bool had = q.has_closed();
      const bool legacy_orders = rng() % 4 == 0;
      ASSERT_EQ(q.wait_oldest(out, legacy_orders), had);
      check_out(out, legacy_orders);
    }
    ASSERT_EQ(q.outstanding_bytes(), expect) << "at operation " << op;
    ASSERT_EQ(q.open_count(), open.size());
  }
  EXPECT_GT(released, 5000u) << "the run should exercise releases";
}
