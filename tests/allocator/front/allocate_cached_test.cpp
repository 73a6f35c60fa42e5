// Allocator::allocate_cached: served by a block already mapped, or nullptr with nothing
// changed. The shim relies on it to hold fenced frees back until their memory is needed, so a
// call that created memory, or a refusal that left the pool inconsistent, would grow every
// preloaded job or corrupt it.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

class AllocateCached : public ::testing::TestWithParam<Mode> {
 protected:
  AllocateCached() : sim_(options()), a_(sim_, Config::parse(GetParam().config)) {}
  static SimBackend::Options options() { return mode_options(GetParam(), 2 * GiB, /*latency=*/4); }
  std::int64_t created() const { return a_.stats().num_device_alloc; }

  SimBackend sim_;
  SimBackend sim_twin_{options()};
  Allocator a_;
};

TEST_P(AllocateCached, ReusesWhatIsHeldAndRefusesWhatIsNot) {
  EXPECT_EQ(a_.allocate_cached(4 * MiB, 0), nullptr) << "nothing is held yet";
  EXPECT_EQ(reserved(a_), 0);
  EXPECT_EQ(created(), 0);
  void* p = a_.allocate(40 * MiB, 0);
  void* small = a_.allocate(1000, 0);
  a_.deallocate(p);
  a_.deallocate(small);
  const std::int64_t held = reserved(a_);
  const std::int64_t chunks = created();
  void* q = a_.allocate_cached(40 * MiB, 0);
  ASSERT_NE(q, nullptr) << "the freed block is held";
  void* s = a_.allocate_cached(1000, 0);
  ASSERT_NE(s, nullptr) << "so is the freed slot";
  EXPECT_EQ(a_.allocate_cached(std::size_t(held) + 2 * MiB, 0), nullptr);
  EXPECT_EQ(reserved(a_), held);
  EXPECT_EQ(created(), chunks);
  a_.check_invariants();
  // A refusal changes nothing a later allocation depends on.
  void* big = a_.allocate(std::size_t(held) + 2 * MiB, 0);
  ASSERT_NE(big, nullptr);
  EXPECT_GT(reserved(a_), held);
  for (void* x : {q, s, big}) a_.deallocate(x);
  a_.check_invariants();
}

TEST_P(AllocateCached, NeverCreatesMemoryInARandomWorkload) {
  std::mt19937_64 rng(11);
  std::vector<void*> live;
  std::size_t served = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    const auto r = rng() % 100;
    const std::size_t bytes = rng() % 3 ? 1 + rng() % (256 * KiB) : 1 + rng() % (64 * MiB);
    const StreamId stream = 1 + rng() % 2;
    if (r < 35 && live.size() < 64) {
      const std::int64_t held = reserved(a_), chunks = created();
      const std::int64_t maps = a_.stats().map_calls, unmaps = a_.stats().unmap_calls;
      void* p = a_.allocate_cached(bytes, stream);
      ASSERT_LE(reserved(a_), held) << "operation " << i;
      ASSERT_EQ(created(), chunks) << "operation " << i;
      ASSERT_EQ(a_.stats().map_calls, maps) << "operation " << i << ": no driver call";
      ASSERT_EQ(a_.stats().unmap_calls, unmaps) << "operation " << i << ": no driver call";
      if (p != nullptr) {
        live.push_back(p);
        ++served;
      } else {
        ++refused;
      }
    } else if (r < 55 && live.size() < 64) {
      try {
        live.push_back(a_.allocate(bytes, stream));
      } catch (const OutOfMemoryError&) {
      }
    } else if (r < 97 && !live.empty()) {
      const std::size_t k = rng() % live.size();
      a_.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      a_.release_cached();
    }
    ASSERT_NO_THROW(a_.check_invariants())
        << "after operation " << i << " (r " << r << ", " << bytes << " B)";
  }
  for (void* p : live) a_.deallocate(p);
  a_.check_invariants();
  EXPECT_GT(served, 200u);
  EXPECT_GT(refused, 20u);
}

// allocate_cached is allocate() less growth: the same workload served by allocate_cached
// first (allocate() where refused) and by allocate() alone gets the same blocks and reserves the
// same memory at every step; a refusal leaves nothing behind that changes later placement.
class AllocateCachedOrAllocate : public AllocateCached {};

TEST_P(AllocateCachedOrAllocate, GetsWhatAllocateGetsAndARefusalChangesNothing) {
  Allocator b(sim_twin_, Config::parse(GetParam().config));
  std::mt19937_64 rng(3);
  std::vector<void*> la, lb;
  std::size_t refused = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::size_t bytes = rng() % 3 ? 1 + rng() % (256 * KiB) : 1 + rng() % (64 * MiB);
    if (rng() % 100 < 52 && la.size() < 64) {
      void* p = a_.allocate_cached(bytes, 0);
      if (p == nullptr) {
        ++refused;
        p = a_.allocate(bytes, 0);
      }
      la.push_back(p);
      lb.push_back(b.allocate(bytes, 0));
      ASSERT_EQ(la.back(), lb.back()) << "operation " << i << ": the same block from both";
    } else if (!la.empty()) {
      const std::size_t k = rng() % la.size();
      a_.deallocate(la[k]);
      b.deallocate(lb[k]);
      la[k] = la.back();
      la.pop_back();
      lb[k] = lb.back();
      lb.pop_back();
    }
    ASSERT_EQ(reserved(a_), reserved(b)) << "after operation " << i;
  }
  EXPECT_GT(refused, 20u);
}

// At the limit (out-of-memory errors, after reclaim) the pool stays consistent too: a block whose
// backing failed goes back in its stream's free order, which defragmentation and sharing take
// oldest first.
TEST_P(AllocateCached, ARefusalAtTheLimitKeepsTheFreeOrder) {
  Config config = Config::parse(GetParam().config);
  config.per_process_memory_fraction = 0.125;  // 256 MiB
  Allocator a(sim_, config);
  std::mt19937_64 rng(5);
  std::vector<void*> live;
  std::size_t ooms = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::size_t bytes = rng() % 3 ? 1 + rng() % (256 * KiB) : 1 + rng() % (64 * MiB);
    if (rng() % 100 < 55 && live.size() < 64) {
      try {
        live.push_back(a.allocate(bytes, 1 + rng() % 2));
      } catch (const OutOfMemoryError&) {
        ++ooms;
      }
    } else if (!live.empty()) {
      const std::size_t k = rng() % live.size();
      a.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    ASSERT_NO_THROW(a.check_invariants()) << "after operation " << i;
  }
  for (void* p : live) a.deallocate(p);
  EXPECT_GT(ooms, 10u);
}

// Not with loop plans: they serve allocate() and, by design, not allocate_cached().
INSTANTIATE_TEST_SUITE_P(Modes, AllocateCachedOrAllocate,
                         ::testing::Values(kModes[0], kModes[1], kModes[3]),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Modes, AllocateCached, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
