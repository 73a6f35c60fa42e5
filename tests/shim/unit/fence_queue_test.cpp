// The shim's fenced synchronous frees (shim/src/fence_queue.cpp, stream_registry.cpp) over a fake
// driver: a block comes back only once every event of its fence has completed, never twice, and
// the byte counts the pacing relies on stay exact.
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
  std::vector<FenceEvent> events;
  ASSERT_TRUE(r.record_fence(events));
  EXPECT_EQ(events.size(), 2u);
  fake::g_capturing = true;
  std::vector<FenceEvent> none;
  EXPECT_FALSE(r.record_fence(none)) << "no event while a stream captures a graph";
  EXPECT_TRUE(none.empty());
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
  std::vector<FenceEvent> events;
  ASSERT_TRUE(r.record_fence(events));
  EXPECT_EQ(events.size(), 3u);  // legacy, 0x31 (live again), 0x41's last event
  fake::complete(events[2].get());
  std::vector<FenceEvent> later;
  ASSERT_TRUE(r.record_fence(later));
  EXPECT_EQ(later.size(), 2u) << "a completed retired event is dropped";
}

TEST(FenceQueue, BlocksComeBackOnlyAfterEveryEventOfTheirFence) {
  StreamRegistry r;
  r.add(stream(0x51), false);
  FenceQueue q;
  ASSERT_TRUE(q.defer(0x1000, 512));
  ASSERT_TRUE(q.defer(0x2000, 1024));
  EXPECT_FALSE(q.defer(0x1000, 512)) << "a double free is refused";
  EXPECT_EQ(q.outstanding_bytes(), 1536u);
  std::vector<FenceEvent> events;
  ASSERT_TRUE(r.record_fence(events));
  ASSERT_EQ(events.size(), 2u);
  std::vector<FenceEvent> held = events;
  q.close(std::move(events));
  std::vector<FenceQueue::Freed> out;
  q.take_completed(out);
  EXPECT_TRUE(out.empty());
  fake::complete(held[1].get());
  q.take_completed(out);
  EXPECT_TRUE(out.empty()) << "one event of two done is not enough";
  fake::complete(held[0].get());
  q.take_completed(out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(q.outstanding_bytes(), 0u);
  EXPECT_FALSE(q.waiting(0x1000));
  EXPECT_TRUE(q.defer(0x1000, 512)) << "freed again after its reuse";
}

TEST(FenceQueue, ARefusedWaitKeepsTheFence) {
  StreamRegistry r;
  FenceQueue q;
  ASSERT_TRUE(q.defer(0x3000, 512));
  std::vector<FenceEvent> events;
  ASSERT_TRUE(r.record_fence(events));
  q.close(std::move(events));
  std::vector<FenceQueue::Freed> out;
  fake::g_sync_refused = true;
  EXPECT_FALSE(q.wait_oldest(out)) << "a wait the driver refused proves nothing";
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(q.waiting(0x3000));
  EXPECT_EQ(q.outstanding_bytes(), 512u);
  fake::g_sync_refused = false;
  EXPECT_TRUE(q.wait_oldest(out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ptr, DevicePtr{0x3000});
}

TEST(StreamRegistry, ACaptureAnywhereIsSeen) {
  StreamRegistry r;
  EXPECT_FALSE(r.any_capturing());
  fake::g_capturing = true;
  EXPECT_TRUE(r.any_capturing()) << "the legacy stream's answer covers blocking streams";
  fake::g_capturing = false;
}

TEST(FenceQueue, RandomizedAgainstAModel) {
  std::mt19937_64 rng(20261201);
  StreamRegistry r;
  for (std::uintptr_t s = 0x61; s < 0x61 + 2 * 4; s += 2) r.add(stream(s), true);
  FenceQueue q;
  struct ModelFence {
    std::vector<FenceEvent> events;
    std::vector<DevicePtr> ptrs;
  };
  std::vector<ModelFence> fences;  // closed, not yet taken, oldest first
  std::vector<DevicePtr> open;
  std::map<DevicePtr, std::size_t> bytes;  // waiting pointers
  std::set<DevicePtr> live;                // allocated and not freed
  DevicePtr next = 0x10000;
  std::size_t released = 0;
  std::size_t expect = 0;  // bytes of the waiting pointers
  auto check_out = [&](const std::vector<FenceQueue::Freed>& out) {
    for (const FenceQueue::Freed& f : out) {
      // It must come from the oldest fences, all of whose events are done.
      auto it = std::find_if(fences.begin(), fences.end(), [&](const ModelFence& m) {
        return std::find(m.ptrs.begin(), m.ptrs.end(), f.ptr) != m.ptrs.end();
      });
      ASSERT_NE(it, fences.end()) << "released a pointer no closed fence holds";
      for (const FenceEvent& e : it->events)
        ASSERT_TRUE(fake::completed(e.get())) << "released early";
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
      std::vector<FenceEvent> events;
      ASSERT_TRUE(r.record_fence(events));
      fences.push_back({events, open});
      open.clear();
      q.close(std::move(events));
    } else if (what == 7 && !fences.empty()) {  // the device reaches some recorded point
      ModelFence& f = fences[rng() % fences.size()];
      fake::complete(f.events[rng() % f.events.size()].get());
    } else if (what == 8) {
      std::vector<FenceQueue::Freed> out;
      q.take_completed(out);
      check_out(out);
    } else if (what == 9 && rng() % 8 == 0) {
      std::vector<FenceQueue::Freed> out;
      const bool had = q.has_closed();
      ASSERT_EQ(q.wait_oldest(out), had);
      check_out(out);
    }
    ASSERT_EQ(q.outstanding_bytes(), expect) << "at operation " << op;
    ASSERT_EQ(q.open_count(), open.size());
  }
  EXPECT_GT(released, 5000u) << "the run should exercise releases";
}
