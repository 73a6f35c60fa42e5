// PrivatePool: segment rules, best fit, coalescing, stream ownership, no_split, checkpoint
// restore, release, errors, statistics, and a randomized run checked after every step.
#include "private_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <vector>

using namespace cuarena;

namespace {

constexpr std::size_t kGranule = 2 * MiB;

// Hands out contiguous granule-aligned segments from a counter (so neighbouring segments touch
// and a merge across them would show), up to `limit` bytes live; checks every deallocate.
struct FakeUpstream {
  DevicePtr next = DevicePtr{1} << 40;
  std::size_t limit = ~std::size_t{0};
  std::size_t live_bytes = 0;
  bool throw_error = false;
  std::map<DevicePtr, std::size_t> live;  // segments given out and not returned
  std::vector<std::size_t> sizes;         // every segment size asked for, in order

  PrivatePool::Upstream upstream() {
    return {[this](std::size_t bytes) -> DevicePtr {
              sizes.push_back(bytes);
              if (throw_error) throw BackendError("fake upstream failure");
              if (bytes > limit - live_bytes) return 0;
              const DevicePtr p = next;
              next += round_up(bytes, kGranule);
              live.emplace(p, bytes);
              live_bytes += bytes;
              return p;
            },
            [this](DevicePtr p, std::size_t bytes) {
              auto it = live.find(p);
              ASSERT_NE(it, live.end()) << "deallocate of a segment not given out";
              EXPECT_EQ(it->second, bytes) << "deallocate with a different size";
              live_bytes -= it->second;
              live.erase(it);
            }};
  }
};

DevicePtr addr(const void* p) { return reinterpret_cast<DevicePtr>(p); }

PrivatePool::Options no_split() {
  PrivatePool::Options o;
  o.no_split = true;
  return o;
}

// (size, allocated) of each block of the pool's only segment.
using Layout = std::vector<std::pair<std::size_t, bool>>;
Layout layout(const PrivatePool& pool) {
  const auto segs = pool.segments();
  EXPECT_EQ(segs.size(), 1u);
  Layout out;
  if (!segs.empty()) {
    for (const auto& b : segs[0].blocks) out.emplace_back(b.size, b.allocated);
  }
  return out;
}

TEST(PrivatePool, SegmentSizeRules) {
  struct Case {
    std::size_t request, segment;
  };
  for (const Case c : {Case{1, 2 * MiB}, Case{1 * MiB, 2 * MiB}, Case{1 * MiB + 1, 20 * MiB},
                       Case{10 * MiB - 512, 20 * MiB}, Case{10 * MiB, 10 * MiB},
                       Case{10 * MiB + 1, 12 * MiB}, Case{64 * MiB + 512, 66 * MiB}}) {
    FakeUpstream up;
    PrivatePool pool(up.upstream());
    pool.allocate(c.request, 0);
    EXPECT_EQ(up.sizes, std::vector<std::size_t>{c.segment}) << "request " << c.request;
    EXPECT_EQ(pool.reserved_bytes(), c.segment);
  }
}

TEST(PrivatePool, RejectsOptionsWhereARequestWouldNotFitItsSegment) {
  FakeUpstream up;
  for (auto bad : {&PrivatePool::Options::granule, &PrivatePool::Options::medium_segment}) {
    PrivatePool::Options o;
    o.*bad = 1 << 19;  // below small_limit / medium_limit
    EXPECT_THROW(PrivatePool(up.upstream(), o), ConfigError);
    o.*bad = 0;
    EXPECT_THROW(PrivatePool(up.upstream(), o), ConfigError);
  }
  PrivatePool::Options o;
  o.granule = 1 << 19;
  o.small_limit = 1 << 19;
  EXPECT_NO_THROW(PrivatePool(up.upstream(), o));
}

TEST(PrivatePool, RoundsTo512AndZeroIsNull) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  EXPECT_EQ(pool.allocate(0, 0), nullptr);
  EXPECT_TRUE(up.sizes.empty());
  void* p = pool.allocate(513, 0);
  EXPECT_EQ(addr(p) % 512, 0u);
  EXPECT_EQ(pool.block_size(p), 1024u);
  EXPECT_EQ(pool.requested_bytes(), 513u);
  EXPECT_NO_THROW(pool.deallocate(nullptr));
  pool.check_invariants();
}

TEST(PrivatePool, BestFitTakesSmallestLowestAndSplits) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  // One 20 MiB segment: [3M][512][2M][512][2M][512][rest], then free the three big ones.
  void* a = pool.allocate(3 * MiB, 1);
  pool.allocate(512, 1);
  void* b = pool.allocate(2 * MiB, 1);
  pool.allocate(512, 1);
  void* c = pool.allocate(2 * MiB, 1);
  pool.allocate(512, 1);
  ASSERT_EQ(up.sizes.size(), 1u);
  for (void* p : {a, b, c}) pool.deallocate(p);
  pool.check_invariants();

  void* q =
      pool.allocate(3 * MiB / 2, 1);  // 2 MiB blocks fit tighter than 3 MiB; b is lower than c
  EXPECT_EQ(q, b);
  EXPECT_EQ(pool.block_size(q), 3 * MiB / 2);
  const auto blocks = layout(pool);
  ASSERT_EQ(blocks.size(), 8u);
  EXPECT_EQ(blocks[2], std::make_pair(3 * MiB / 2, true));
  EXPECT_EQ(blocks[3], std::make_pair(MiB / 2, false));  // the remainder stays free
  EXPECT_EQ(pool.allocate(MiB / 2, 1), static_cast<char*>(b) + 3 * MiB / 2);  // exact fit
  EXPECT_EQ(pool.allocate(5 * MiB / 2, 1), a);
  EXPECT_EQ(up.sizes.size(), 1u);
  pool.check_invariants();
}

TEST(PrivatePool, CoalescesFreeNeighboursWithinASegmentOnly) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  void* a = pool.allocate(4 * MiB, 1);
  void* b = pool.allocate(4 * MiB, 1);
  void* c = pool.allocate(4 * MiB, 1);
  pool.deallocate(a);
  pool.deallocate(c);  // merges with the free tail
  EXPECT_EQ(layout(pool).size(), 3u);
  pool.deallocate(b);  // merges both ways
  EXPECT_EQ(layout(pool), Layout({{20 * MiB, false}}));
  EXPECT_EQ(pool.largest_free_block(), 20 * MiB);

  // Two 10 MiB segments that touch in address space stay two blocks.
  void* s = pool.allocate(10 * MiB, 2);
  void* t = pool.allocate(10 * MiB, 2);
  ASSERT_EQ(addr(s) + 10 * MiB, addr(t));
  pool.deallocate(s);
  pool.deallocate(t);
  EXPECT_EQ(pool.segment_count(), 3u);
  for (const auto& seg : pool.segments()) EXPECT_EQ(seg.blocks.size(), 1u);
  pool.check_invariants();
}

TEST(PrivatePool, NeighboursOfDifferentOwnersMergeOnceShared) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  void* a = pool.allocate(4 * MiB, 1);
  pool.share_free_blocks();             // the tail becomes shared
  void* b = pool.allocate(4 * MiB, 2);  // carved from the shared tail
  ASSERT_EQ(addr(b), addr(a) + 4 * MiB);
  pool.deallocate(a);
  pool.deallocate(b);
  EXPECT_EQ(layout(pool).size(), 3u);  // owned by 1, owned by 2, shared
  pool.check_invariants();
  pool.share_free_blocks();
  EXPECT_EQ(layout(pool), Layout({{20 * MiB, false}}));
  pool.check_invariants();
}

TEST(PrivatePool, NoSplitGivesWholeBlocks) {
  FakeUpstream up;
  PrivatePool pool(up.upstream(), no_split());
  void* p = pool.allocate(1 * KiB, 1);
  EXPECT_EQ(up.sizes, std::vector<std::size_t>{2 * MiB});
  EXPECT_EQ(pool.block_size(p), 2 * MiB);
  EXPECT_EQ(pool.allocated_bytes(), 2 * MiB);
  EXPECT_EQ(pool.requested_bytes(), 1 * KiB);
  void* big = pool.allocate(3 * MiB, 1);  // no 20 MiB medium segment
  EXPECT_EQ(up.sizes.back(), 4 * MiB);
  pool.deallocate(p);
  pool.deallocate(big);
  EXPECT_EQ(pool.allocate(512, 1), p);  // the smallest free block that fits, whole
  EXPECT_EQ(pool.block_size(p), 2 * MiB);
  pool.allocate(5 * MiB, 1);  // fits no free block
  EXPECT_EQ(up.sizes.back(), 6 * MiB);
  EXPECT_EQ(pool.allocate(1 * MiB, 1), big);
  EXPECT_EQ(pool.block_size(big), 4 * MiB);
  EXPECT_EQ(pool.segment_count(), 3u);
  for (const auto& seg : pool.segments()) EXPECT_EQ(seg.blocks.size(), 1u);
  pool.check_invariants();
}

TEST(PrivatePool, AllocateAtCarvesARangeOfAFreeBlock) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  void* p = pool.allocate(8 * MiB, 1);
  pool.deallocate(p);  // one free 20 MiB block
  const DevicePtr base = addr(p);
  pool.allocate_at(base + 2 * MiB, 1 * MiB, 1000, 3);
  const void* at = reinterpret_cast<void*>(base + 2 * MiB);
  EXPECT_TRUE(pool.is_live(at));
  EXPECT_EQ(pool.block_size(at), 1 * MiB);
  EXPECT_EQ(pool.requested_bytes(), 1000u);
  EXPECT_EQ(layout(pool), Layout({{2 * MiB, false}, {1 * MiB, true}, {17 * MiB, false}}));
  ASSERT_EQ(pool.live().size(), 1u);
  EXPECT_EQ(pool.live()[0].stream, 3u);
  pool.check_invariants();
  // At the start and at the end of free blocks.
  pool.allocate_at(base, 2 * MiB, 2 * MiB, 1);
  pool.allocate_at(base + 19 * MiB, 1 * MiB, 512, 1);
  EXPECT_EQ(layout(pool).size(), 4u);
  pool.check_invariants();
  for (const auto& b : pool.live()) pool.deallocate(reinterpret_cast<void*>(b.addr));
  EXPECT_EQ(layout(pool).size(), 3u);  // owned by 1, by 3, by 1
  pool.share_free_blocks();
  EXPECT_EQ(layout(pool), Layout({{20 * MiB, false}}));
  pool.check_invariants();
}

TEST(PrivatePool, AllocateAtRejectsRangesNotInsideOneFreeBlock) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  void* p = pool.allocate(4 * MiB, 1);  // [p, +4M) live, [p+4M, +16M) free
  void* s = pool.allocate(1, 2);        // a 2 MiB segment above: its tail is free
  const DevicePtr base = addr(p);
  const std::size_t reserved = pool.reserved_bytes(), allocated = pool.allocated_bytes();
  struct Case {
    DevicePtr ptr;
    std::size_t bytes, requested;
  };
  for (const Case c : {
           Case{base, 512, 512},                    // a live block
           Case{base + 4 * MiB - 512, 1024, 1024},  // straddles live and free
           Case{base + 19 * MiB, 2 * MiB, 512},     // runs past the segment's end
           Case{base - 2 * MiB, 512, 512},          // below every segment
           Case{addr(s) + 1 * MiB, 2 * MiB, 512},   // past the last segment's end
           Case{addr(s) + 4 * MiB, 512, 512},       // above every segment
           Case{base + 4 * MiB + 100, 512, 512},    // unaligned address
           Case{base + 4 * MiB, 700, 512},          // unaligned size
           Case{base + 4 * MiB, 0, 0},              // empty
           Case{base + 4 * MiB, 512, 1024},         // requested more than the size
       }) {
    EXPECT_THROW(pool.allocate_at(c.ptr, c.bytes, c.requested, 1), std::logic_error)
        << std::hex << c.ptr << " +" << std::dec << c.bytes;
    EXPECT_EQ(pool.reserved_bytes(), reserved);
    EXPECT_EQ(pool.allocated_bytes(), allocated);
    EXPECT_EQ(pool.live_blocks(), 2u);
    pool.check_invariants();
  }
}

TEST(PrivatePool, ReleaseFreeSegmentsReturnsOnlyWhollyFreeOnes) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  void* busy = pool.allocate(4 * MiB, 1);
  void* a = pool.allocate(4 * MiB, 2);           // own 20 MiB segment
  void* b = pool.allocate(12 * MiB, 3);          // own 12 MiB segment
  void* c = pool.allocate(4 * MiB, 3);           // own 20 MiB segment
  void* d = pool.allocate(4 * MiB, 3);           // beside c
  for (void* p : {a, b, c}) pool.deallocate(p);  // c's segment still holds d
  EXPECT_EQ(pool.release_free_segments(), 32 * MiB);
  EXPECT_EQ(pool.segment_count(), 2u);
  EXPECT_EQ(pool.reserved_bytes(), 40 * MiB);
  EXPECT_EQ(up.live,
            (std::map<DevicePtr, std::size_t>{{addr(busy), 20 * MiB}, {addr(c), 20 * MiB}}));
  EXPECT_TRUE(pool.owns(busy));
  EXPECT_FALSE(pool.owns(a));
  pool.check_invariants();
  EXPECT_EQ(pool.release_free_segments(), 0u);
  pool.deallocate(d);
  EXPECT_EQ(pool.release_free_segments(), 20 * MiB);
  EXPECT_EQ(up.live.size(), 1u);
  pool.check_invariants();
}

TEST(PrivatePool, DestructorReturnsEverySegment) {
  FakeUpstream up;
  {
    PrivatePool pool(up.upstream());
    pool.allocate(4 * MiB, 1);
    pool.deallocate(pool.allocate(30 * MiB, 2));
    pool.allocate(100, 3);
    EXPECT_EQ(up.live.size(), 3u);
  }
  EXPECT_TRUE(up.live.empty());
}

TEST(PrivatePool, OutOfMemoryWhenUpstreamRefuses) {
  FakeUpstream up;
  up.limit = 24 * MiB;
  PrivatePool pool(up.upstream());
  void* p = pool.allocate(4 * MiB, 1);  // 20 MiB
  try {
    pool.allocate(18 * MiB + 1, 1);  // fits no free block; needs a 20 MiB segment
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested_bytes(), 18 * MiB + 1);
  }
  EXPECT_EQ(pool.segment_count(), 1u);
  EXPECT_EQ(pool.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(pool.live_blocks(), 1u);
  EXPECT_EQ(up.live.size(), 1u);  // nothing taken, nothing leaked
  pool.check_invariants();

  up.throw_error = true;  // upstream errors pass through, nothing changes either
  EXPECT_THROW(pool.allocate(30 * MiB, 1), BackendError);
  EXPECT_EQ(pool.segment_count(), 1u);
  pool.check_invariants();
  up.throw_error = false;

  EXPECT_EQ(pool.allocate(16 * MiB, 1), static_cast<char*>(p) + 4 * MiB);  // the free tail
  EXPECT_NE(pool.allocate(1 * MiB, 2), nullptr);  // 2 MiB more fits under the limit
  EXPECT_EQ(up.live.size(), 2u);
  pool.check_invariants();
}

TEST(PrivatePool, StatisticsAndViews) {
  FakeUpstream up;
  PrivatePool pool(up.upstream());
  EXPECT_EQ(pool.largest_free_block(), 0u);
  void* a = pool.allocate(3 * MiB + 1, 7);
  void* b = pool.allocate(100, 8);
  EXPECT_EQ(pool.reserved_bytes(), 22 * MiB);
  EXPECT_EQ(pool.allocated_bytes(), 3 * MiB + 512 + 512);
  EXPECT_EQ(pool.requested_bytes(), 3 * MiB + 1 + 100);
  EXPECT_EQ(pool.live_blocks(), 2u);
  EXPECT_EQ(pool.segment_count(), 2u);
  EXPECT_EQ(pool.largest_free_block(), 17 * MiB - 512);
  EXPECT_TRUE(pool.owns(static_cast<char*>(a) + 10 * MiB));
  EXPECT_FALSE(pool.owns(static_cast<char*>(a) + 22 * MiB));

  const auto segs = pool.segments();
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].addr, addr(a));
  EXPECT_EQ(segs[0].stream, 7u);
  EXPECT_EQ(segs[1].stream, 8u);
  ASSERT_EQ(segs[1].blocks.size(), 2u);
  EXPECT_EQ(segs[1].blocks[0].addr, addr(b));
  EXPECT_EQ(segs[1].blocks[0].requested, 100u);
  EXPECT_TRUE(segs[1].blocks[0].allocated);
  EXPECT_EQ(segs[1].blocks[1].size, 2 * MiB - 512);
  const auto live = pool.live();
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[1].addr, addr(b));
  EXPECT_EQ(live[1].size, 512u);
  EXPECT_EQ(live[1].requested, 100u);
  EXPECT_EQ(live[1].stream, 8u);

  pool.deallocate(a);
  EXPECT_EQ(pool.allocated_bytes(), 512u);
  EXPECT_EQ(pool.requested_bytes(), 100u);
  EXPECT_EQ(pool.live_blocks(), 1u);
  EXPECT_EQ(pool.largest_free_block(), 20 * MiB);
  EXPECT_EQ(pool.block_size(a), 0u);
  pool.check_invariants();
}

// Random allocations (1 B..64 MiB, log-uniform) and frees over 3 streams, with occasional
// share_free_blocks, release_free_segments, allocate_at of a free range and bad frees; the pool
// is checked against a model after every operation.
void random_run(PrivatePool::Options options, int operations, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  };
  FakeUpstream up;
  up.limit = 2 * GiB;
  PrivatePool pool(up.upstream(), options);
  struct Live {
    std::size_t size, requested;
    StreamId stream;
  };
  std::map<DevicePtr, Live> model;
  // Ranges freed since the last share_free_blocks, by stream: disjoint, and no other stream's
  // allocate() may touch them.
  std::map<DevicePtr, std::pair<std::size_t, StreamId>> owned;
  std::size_t model_allocated = 0, ooms = 0, carved = 0;

  auto add = [&](DevicePtr a, std::size_t size, std::size_t requested, StreamId stream,
                 bool check_owner) {
    ASSERT_TRUE(pool.owns(reinterpret_cast<void*>(a)));
    ASSERT_TRUE(pool.owns(reinterpret_cast<void*>(a + size - 1)));
    auto above = model.lower_bound(a);
    ASSERT_TRUE(above == model.end() || above->first >= a + size) << "overlaps the block above";
    ASSERT_TRUE(above == model.begin() ||
                std::prev(above)->first + std::prev(above)->second.size <= a)
        << "overlaps the block below";
    auto o = owned.upper_bound(a);
    if (o != owned.begin() && std::prev(o)->first + std::prev(o)->second.first > a) --o;
    while (o != owned.end() && o->first < a + size) {
      ASSERT_TRUE(!check_owner || o->second.second == stream)
          << "stream " << stream << " took a block stream " << o->second.second << " freed";
      o = owned.erase(o);
    }
    model.emplace(a, Live{size, requested, stream});
    model_allocated += size;
  };

  for (int op = 0; op < operations; ++op) {
    const std::size_t r = uniform(0, 999);
    const StreamId stream = uniform(1, 3);
    if (model.empty() || r < (model.size() > 300 ? 300u : 520u)) {
      const std::size_t k = uniform(0, 26);
      const std::size_t bytes =
          uniform(std::size_t{1} << k, std::min((std::size_t{2} << k) - 1, 64 * MiB));
      try {
        void* p = pool.allocate(bytes, stream);
        const std::size_t size = pool.block_size(p);
        ASSERT_GE(size, bytes);
        ASSERT_EQ(addr(p) % 512, 0u);
        add(addr(p), size, bytes, stream, true);
        if (::testing::Test::HasFatalFailure()) return;
      } catch (const OutOfMemoryError&) {
        ++ooms;
        pool.release_free_segments();
      }
    } else if (r < 950) {
      auto it = std::next(model.begin(), static_cast<long>(uniform(0, model.size() - 1)));
      pool.deallocate(reinterpret_cast<void*>(it->first));
      owned.emplace(it->first, std::make_pair(it->second.size, it->second.stream));
      model_allocated -= it->second.size;
      model.erase(it);
    } else if (r < 965) {
      pool.share_free_blocks();
      owned.clear();
    } else if (r < 975) {
      const std::size_t before = pool.reserved_bytes();
      const std::size_t released = pool.release_free_segments();
      ASSERT_EQ(released, before - pool.reserved_bytes());
    } else if (r < 990) {
      std::vector<PrivatePool::BlockView> free;
      for (const auto& seg : pool.segments()) {
        for (const auto& b : seg.blocks) {
          if (!b.allocated) free.push_back(b);
        }
      }
      if (free.empty()) continue;
      const auto& b = free[uniform(0, free.size() - 1)];
      const std::size_t offset = uniform(0, b.size / 512 - 1) * 512;
      const std::size_t bytes = uniform(1, (b.size - offset) / 512) * 512;
      const std::size_t requested = uniform(1, bytes);
      pool.allocate_at(b.addr + offset, bytes, requested, stream);
      add(b.addr + offset, bytes, requested, stream, false);
      if (::testing::Test::HasFatalFailure()) return;
      ++carved;
    } else {
      // An interior pointer, or a block freed and not reused since the last share.
      const DevicePtr a =
          owned.empty() || uniform(0, 1) ? model.begin()->first + 512 : owned.begin()->first;
      if (!model.count(a)) {
        EXPECT_THROW(pool.deallocate(reinterpret_cast<void*>(a)), InvalidPointerError);
      }
    }
    ASSERT_NO_THROW(pool.check_invariants()) << "after operation " << op;
    ASSERT_EQ(pool.live_blocks(), model.size());
    ASSERT_EQ(pool.allocated_bytes(), model_allocated);
    ASSERT_EQ(up.live_bytes, pool.reserved_bytes());
    if (op % 1000 == 0) {
      std::vector<PrivatePool::LiveBlock> expected;
      for (const auto& [a, l] : model) expected.push_back({a, l.size, l.requested, l.stream});
      const auto got = pool.live();
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].addr, expected[i].addr);
        ASSERT_EQ(got[i].size, expected[i].size);
        ASSERT_EQ(got[i].requested, expected[i].requested);
        ASSERT_EQ(got[i].stream, expected[i].stream);
      }
    }
  }
  EXPECT_GT(ooms, 0u);  // the run reached the upstream limit
  EXPECT_GT(carved, 0u);
}

TEST(PrivatePool, RandomizedKeepsInvariants) { random_run({}, 100000, 20261201); }

TEST(PrivatePool, RandomizedNoSplitKeepsInvariants) { random_run(no_split(), 30000, 7); }

}  // namespace
