// VmmTokens: each order of the driver's calls a program may make, and a randomized run of them
// against a model of what CUDA keeps alive (a block is freed exactly once, when its range is
// freed and its last handle reference released, whichever comes last).
#include "vmm_tokens.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

using cuarena::DevicePtr;
using cuarena::shim::VmmTokens;

namespace {
constexpr std::size_t kGranule = std::size_t{2} << 20;

TEST(VmmTokens, XlaOrderFreesTheBlockAtRelease) {
  VmmTokens v;
  const auto h = v.create(4 * kGranule, 0);
  ASSERT_EQ(v.pending_for(4 * kGranule, kGranule), h);
  v.bind(h, 0x1000000);
  EXPECT_FALSE(v.pending_for(4 * kGranule, kGranule)) << "a bound token is no longer pending";
  EXPECT_EQ(v.map(0x1000000, 4 * kGranule, 0, h), VmmTokens::Map::kBound);
  ASSERT_TRUE(v.range(0x1000000));
  EXPECT_TRUE(v.unmap(0x1000000));
  const VmmTokens::Freed range = v.free_range(0x1000000);
  EXPECT_TRUE(range.ours);
  EXPECT_EQ(range.block, 0u) << "the handle still holds the memory";
  const VmmTokens::Freed rel = v.release(h);
  EXPECT_TRUE(rel.ours);
  EXPECT_EQ(rel.block, 0x1000000u);
  EXPECT_EQ(v.tokens(), 0u);
  v.check();
}

TEST(VmmTokens, WhatWasAskedIsKeptThroughBindAndMaterialize) {
  VmmTokens v;
  const VmmTokens::Traits xla{1, true};  // a POSIX file-descriptor handle, RDMA capable
  const auto bound = v.create(kGranule, 0, xla);
  v.bind(bound, 0x1000000);
  EXPECT_EQ(v.get(bound)->traits, xla);
  const auto made = v.create(kGranule, 0, xla);
  EXPECT_EQ(v.map(0x9000000, kGranule, 0, made), VmmTokens::Map::kMaterialize);
  v.set_real(made, 42);
  EXPECT_EQ(v.get(made)->traits, xla) << "the real handle is created as asked";
  EXPECT_EQ(v.get(v.create(kGranule, 0))->traits, VmmTokens::Traits{}) << "plain by default";
  v.check();
}

TEST(VmmTokens, ReleaseFirstKeepsTheBlockUntilTheRangeIsFreed) {
  VmmTokens v;
  const auto h = v.create(kGranule, 0);
  v.bind(h, 0x2000000);
  ASSERT_EQ(v.map(0x2000000, kGranule, 0, h), VmmTokens::Map::kBound);
  EXPECT_EQ(v.release(h).block, 0u) << "CUDA keeps a mapping's memory after its handle's release";
  v.check();
  EXPECT_TRUE(v.unmap(0x2000000));
  EXPECT_EQ(v.free_range(0x2000000).block, 0x2000000u);
  EXPECT_EQ(v.tokens(), 0u);
  v.check();
}

TEST(VmmTokens, ReservationWithinAGranuleOfTheTokenMatches) {
  VmmTokens v;
  const auto h = v.create(3 * kGranule, 0);
  EXPECT_EQ(v.pending_for(3 * kGranule - 4096, kGranule), h);
  EXPECT_FALSE(v.pending_for(2 * kGranule, kGranule)) << "a granule short: another purpose";
  EXPECT_FALSE(v.pending_for(3 * kGranule + 1, kGranule)) << "larger than the memory";
}

TEST(VmmTokens, MappedIntoTheDriversRangeItMaterializes) {
  VmmTokens v;
  const auto h = v.create(kGranule, 0);
  // Reserve-first: the program's range is the driver's; the token must become real memory.
  EXPECT_EQ(v.map(0x7000000, kGranule, 0, h), VmmTokens::Map::kMaterialize);
  v.set_real(h, 42);
  EXPECT_FALSE(v.pending_for(kGranule, kGranule));
  EXPECT_EQ(v.map(0x7000000, kGranule, 0, h), VmmTokens::Map::kReal);
  const VmmTokens::Freed f = v.release(h);
  EXPECT_EQ(f.real, 42u);
  EXPECT_EQ(f.block, 0u);
  EXPECT_EQ(v.tokens(), 0u);
}

TEST(VmmTokens, TwoCreatesThenTwoReservesMapEachHandleOnce) {
  VmmTokens v;
  const auto h1 = v.create(kGranule, 0);
  const auto h2 = v.create(kGranule, 0);
  ASSERT_EQ(v.pending_for(kGranule, kGranule), h2);  // the thread's latest
  v.bind(h2, 0x6000000);                             // the first reserve: R1
  EXPECT_FALSE(v.pending_for(kGranule, kGranule));   // the second reserve is the driver's: R2
  // map(R1, h1): h1 takes R1's block, h2 is pending again, and materializes at map(R2, h2).
  EXPECT_EQ(v.map(0x6000000, kGranule, 0, h1), VmmTokens::Map::kBound);
  EXPECT_EQ(v.map(0x9000000, kGranule, 0, h2), VmmTokens::Map::kMaterialize);
  v.set_real(h2, 7);
  v.check();
  EXPECT_EQ(v.free_range(0x6000000).block, 0u);
  EXPECT_EQ(v.release(h1).block, 0x6000000u);
  EXPECT_EQ(v.release(h2).real, 7u);
  EXPECT_EQ(v.tokens(), 0u);
}

TEST(VmmTokens, ABoundTokenElsewhereWouldAlias) {
  VmmTokens v;
  const auto h = v.create(kGranule, 0);
  v.bind(h, 0x3000000);
  EXPECT_EQ(v.map(0x5000000, kGranule, 0, h), VmmTokens::Map::kAlias);
  EXPECT_EQ(v.map(0x3000000, kGranule, kGranule, h), VmmTokens::Map::kAlias) << "offset";
}

TEST(VmmTokens, PendingIsPerThread) {
  VmmTokens v;
  const auto h = v.create(kGranule, 0);
  std::optional<VmmTokens::Handle> other;
  std::thread([&] { other = v.pending_for(kGranule, kGranule); }).join();
  EXPECT_FALSE(other) << "another thread's reservation must not take this thread's token";
  EXPECT_EQ(v.pending_for(kGranule, kGranule), h);
}

TEST(VmmTokens, NotATokenIsNotOurs) {
  VmmTokens v;
  EXPECT_FALSE(v.is_token(12345));
  EXPECT_FALSE(v.release(12345).ours);
  EXPECT_FALSE(v.free_range(0x1000).ours);
  EXPECT_FALSE(v.unmap(0x1000));
  EXPECT_FALSE(v.retain(0x1000));
}

TEST(VmmTokens, RetainedHandleNeedsItsOwnRelease) {
  VmmTokens v;
  const auto h = v.create(kGranule, 0);
  v.bind(h, 0x4000000);
  EXPECT_EQ(v.retain(0x4000000), h);
  EXPECT_EQ(v.release(h).block, 0u);
  EXPECT_EQ(v.free_range(0x4000000).block, 0u) << "one reference is still held";
  EXPECT_EQ(v.release(h).block, 0x4000000u);
  v.check();
}

// Random interleavings of many buffers' calls: every block is freed exactly once, and only once
// both its range is freed and every reference released.
TEST(VmmTokens, RandomizedLifetimes) {
  std::mt19937_64 rng(11);
  VmmTokens v;
  struct Buffer {
    VmmTokens::Handle h;
    DevicePtr block;
    int refs = 1;
    bool range = true;
  };
  std::vector<Buffer> live;
  std::set<DevicePtr> freed;
  DevicePtr next = 0x10000000;
  for (int op = 0; op < 20000; ++op) {
    const int what = int(rng() % 5);
    if (what == 0 || live.empty()) {
      const std::size_t size = (1 + rng() % 8) * kGranule;
      const auto h = v.create(size, 0);
      ASSERT_EQ(v.pending_for(size - rng() % kGranule, kGranule), h);
      v.bind(h, next);
      ASSERT_EQ(v.map(next, size, 0, h), VmmTokens::Map::kBound);
      live.push_back({h, next});
      next += size;
      continue;
    }
    const std::size_t i = rng() % live.size();
    Buffer& b = live[i];
    VmmTokens::Freed f;
    if (what == 1 && b.range) {
      v.unmap(b.block);
      f = v.free_range(b.block);
      b.range = false;
    } else if (what == 2 && b.range) {
      ASSERT_EQ(v.retain(b.block), b.h);
      ++b.refs;
    } else if (b.refs > 0) {
      f = v.release(b.h);
      --b.refs;
    }
    const bool gone = !b.range && b.refs == 0;
    ASSERT_EQ(f.block != 0, gone && f.ours) << "op " << op;
    if (f.block != 0) {
      ASSERT_EQ(f.block, b.block);
      ASSERT_TRUE(freed.insert(f.block).second) << "freed twice";
    }
    if (gone) {
      ASSERT_TRUE(freed.count(b.block)) << "op " << op << ": never freed";
      live[i] = live.back();
      live.pop_back();
    }
    if (op % 500 == 0) v.check();
  }
  v.check();
  EXPECT_EQ(v.tokens(), live.size());
}
}  // namespace
