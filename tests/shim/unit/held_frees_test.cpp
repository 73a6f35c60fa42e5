// The shim's synchronous frees (shim/src/held_frees.cpp, stream_registry.cpp) over a fake driver
// that keeps CUDA's ordering rules (fake_driver.hpp): a held block comes back only through a
// fence, and every command the program issues after that fence, on any stream it knows, is
// ordered after every command issued before the free. A missed stream here is a kernel writing
// into memory another kernel already reuses.
#include "held_frees.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "fake_driver.hpp"
#include "stream_registry.hpp"

using namespace cuarena;
using namespace cuarena::shim;

namespace {
CUstream stream(std::uintptr_t id) { return reinterpret_cast<CUstream>(id); }  // odd: non-blocking

class Fences : public ::testing::Test {
 protected:
  void SetUp() override { fake::reset(); }
  void TearDown() override { fake::reset(); }
  static std::size_t waits_by(CUstream s) {
    return std::size_t(std::count_if(fake::g_waits.begin(), fake::g_waits.end(),
                                     [&](const auto& w) { return w.first == s; }));
  }
};
}  // namespace

TEST_F(Fences, HeldFreesAreCountedRefusedTwiceAndTakenOldestFirst) {
  HeldFrees h;
  ASSERT_TRUE(h.hold(0x1000, 512));
  ASSERT_TRUE(h.hold(0x2000, 1024));
  EXPECT_FALSE(h.hold(0x1000, 512)) << "a double free is refused";
  EXPECT_EQ(h.bytes(), 1536u);
  EXPECT_EQ(h.count(), 2u);
  EXPECT_TRUE(h.held(0x2000));
  std::vector<HeldFrees::Freed> out;
  h.take_all(out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].ptr, DevicePtr{0x1000});
  EXPECT_EQ(out[1].ptr, DevicePtr{0x2000});
  EXPECT_EQ(h.bytes(), 0u);
  EXPECT_FALSE(h.held(0x1000));
  EXPECT_TRUE(h.hold(0x1000, 512)) << "freed again after its reuse";
}

TEST_F(Fences, AHeldFitIsFoundWithinItsBounds) {
  HeldFrees h;
  ASSERT_TRUE(h.hold(0x1000, 4096));
  ASSERT_TRUE(h.hold(0x2000, 1 << 20));
  EXPECT_TRUE(h.holds_fit(4096, 4096));
  EXPECT_TRUE(h.holds_fit(1000, 4000 * 4)) << "4096 lies in [1000, 16000]";
  EXPECT_FALSE(h.holds_fit(5000, 20000)) << "nothing held in [5000, 20000]";
  EXPECT_TRUE(h.holds_fit(5000, 1 << 20));
  EXPECT_FALSE(h.holds_fit((1 << 20) + 1, SIZE_MAX));
  std::vector<HeldFrees::Freed> out;
  h.take_all(out);
  EXPECT_FALSE(h.holds_fit(1, SIZE_MAX)) << "nothing held once taken";
}

TEST_F(Fences, TheLegacyStreamWaitsForNonBlockingStreamsAndTheyForTheFence) {
  StreamRegistry r;
  r.add(stream(0x11), false);  // non-blocking, busy below
  r.add(stream(0x21), false);  // non-blocking, idle
  r.add(stream(0x40), false);  // blocking: ordered by the legacy stream already
  fake::launch(stream(0x11));
  ASSERT_TRUE(r.record_fence());
  EXPECT_EQ(waits_by(CU_STREAM_LEGACY), 2u) << "for each non-blocking stream's queued work";
  EXPECT_EQ(waits_by(stream(0x11)), 1u);
  EXPECT_EQ(waits_by(stream(0x21)), 1u) << "an idle stream's later work must follow too";
  EXPECT_EQ(waits_by(stream(0x40)), 0u);
  EXPECT_EQ(r.live_non_blocking(), 2u);
}

TEST_F(Fences, NoFenceDuringACapture) {
  StreamRegistry r;
  fake::g_capturing = true;
  EXPECT_TRUE(r.any_capturing()) << "the legacy stream's answer covers blocking streams";
  EXPECT_FALSE(r.record_fence());
  EXPECT_TRUE(fake::g_waits.empty());
  fake::g_capturing = false;
  // Captures the hooks counted, with no driver query saying so.
  r.capture_begins(stream(0xb1));
  r.capture_begins(stream(0xc1));
  r.capture_ends(stream(0xb1));
  EXPECT_TRUE(r.any_capturing()) << "0xc1 still captures";
  EXPECT_FALSE(r.record_fence());
  r.capture_ends(stream(0xd1));  // never began: no effect
  r.capture_ends(stream(0xc1));
  EXPECT_FALSE(r.any_capturing());
  EXPECT_TRUE(r.record_fence());
}

TEST_F(Fences, ParkedStreamsAreCoveredAndHandedBackAfterTheNewestFence) {
  StreamRegistry r;
  r.add(stream(0x31), true);   // cuarena allocated on it
  r.add(stream(0x41), false);  // never used by cuarena
  fake::launch(stream(0x31));
  fake::launch(stream(0x41));
  EXPECT_FALSE(r.retire(stream(0x31))) << "a stream cuarena used must not be destroyed";
  EXPECT_TRUE(r.retire(stream(0x41)));
  EXPECT_EQ(r.live_non_blocking(), 0u);
  ASSERT_TRUE(r.record_fence());
  EXPECT_EQ(waits_by(CU_STREAM_LEGACY), 2u) << "the parked stream's and the retired one's work";
  fake::finish(stream(0x41));
  EXPECT_EQ(waits_by(stream(0x31)), 0u) << "a parked stream gets no new work";
  fake::g_waits.clear();
  EXPECT_EQ(r.reuse(CU_STREAM_NON_BLOCKING, 0), stream(0x31));
  EXPECT_EQ(r.reuse(CU_STREAM_NON_BLOCKING, 0), nullptr) << "handed back once";
  EXPECT_EQ(waits_by(stream(0x31)), 1u) << "handed back: after the newest fence";
  fake::g_waits.clear();
  ASSERT_TRUE(r.record_fence());
  EXPECT_EQ(waits_by(CU_STREAM_LEGACY), 1u) << "the retired stream was covered by the last fence";
}

TEST_F(Fences, ANewNonBlockingStreamWaitsForTheNewestFence) {
  StreamRegistry r;
  r.add(stream(0x71), false);
  EXPECT_TRUE(fake::g_waits.empty()) << "no fence yet: nothing to wait for";
  ASSERT_TRUE(r.record_fence());
  fake::g_waits.clear();
  r.add(stream(0x91), false);
  ASSERT_EQ(fake::g_waits.size(), 1u);
  EXPECT_EQ(fake::g_waits[0].first, stream(0x91));
}

TEST_F(Fences, AStreamDestroyedBehindTheHooksIsForgotten) {
  StreamRegistry r;
  r.add(stream(0x51), false);
  r.add(stream(0x61), false);
  fake::launch(stream(0x51));
  fake::g_dead = {stream(0x51)};
  ASSERT_TRUE(r.record_fence()) << "one dead handle does not stop the fence";
  EXPECT_EQ(r.live_non_blocking(), 1u);
  EXPECT_EQ(waits_by(stream(0x61)), 1u);
}

// The property the design rests on, over random programs: blocking, non-blocking, per-thread
// and legacy streams, streams created, destroyed, parked and handed back, streams finishing, and
// blocks freed, fenced and used again on any stream.
TEST_F(Fences, EveryUseAfterTheFenceFollowsEveryCommandBeforeTheFree) {
  std::mt19937_64 rng(20261204);
  StreamRegistry r;
  HeldFrees held;
  std::vector<CUstream> program = {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};  // live streams
  std::uintptr_t next_handle = 0x100;
  std::map<DevicePtr, fake::Clock> freed_at;  // held blocks: issued() at their free
  std::map<DevicePtr, fake::Clock> reusable;  // given back: what their next use must follow
  std::vector<DevicePtr> live;
  for (DevicePtr p = 0x10000; p < 0x10000 + 64 * 0x100; p += 0x100) live.push_back(p);
  std::size_t uses = 0, fences = 0;
  for (int i = 0; i < 30000; ++i) {
    const auto op = rng() % 100;
    CUstream s = program[rng() % program.size()];
    if (op < 40) {  // a kernel, on a block given back if there is one
      const fake::Clock c = fake::launch(s);
      if (!reusable.empty() && rng() % 2) {
        auto it = std::next(reusable.begin(), std::ptrdiff_t(rng() % reusable.size()));
        ASSERT_TRUE(fake::covers(c, it->second))
            << "operation " << i << ": block " << it->first << " used on stream " << s
            << " before work issued ahead of its free is ordered";
        ++uses;
        live.push_back(it->first);
        reusable.erase(it);
      }
    } else if (op < 60 && !live.empty()) {  // cudaFree
      const std::size_t k = rng() % live.size();
      ASSERT_TRUE(held.hold(live[k], 512));
      freed_at[live[k]] = fake::issued();
      live[k] = live.back();
      live.pop_back();
    } else if (op < 70) {  // an allocation that needs held memory
      if (r.record_fence()) {
        std::vector<HeldFrees::Freed> out;
        held.take_all(out);
        for (const HeldFrees::Freed& f : out) {
          reusable[f.ptr] = freed_at.at(f.ptr);
          freed_at.erase(f.ptr);
        }
        ++fences;
      }
    } else if (op < 80) {
      fake::finish(s);
    } else if (op < 87 && program.size() < 12) {  // the program makes a stream
      const bool non_blocking = rng() % 4 != 0;
      CUstream n = r.reuse(non_blocking ? CU_STREAM_NON_BLOCKING : 0, 0);
      if (n == nullptr) {
        n = stream(next_handle + (non_blocking ? 1 : 0));
        next_handle += 0x10;
        r.add(n, rng() % 2 == 0);
      }
      program.push_back(n);
    } else if (op < 92 && program.size() > 2) {  // ... and destroys one (not a default stream)
      const std::size_t k = 2 + rng() % (program.size() - 2);
      r.retire(program[k]);  // destroyed for real or parked: no new work either way
      program.erase(program.begin() + std::ptrdiff_t(k));
    } else if (op < 95) {
      r.add(s, true);  // cuarena allocates or frees on it
    } else {
      fake::g_capturing = !fake::g_capturing && rng() % 4 == 0;
    }
  }
  EXPECT_GT(uses, 3000u);
  EXPECT_GT(fences, 1000u);
}
