// FreeIndex (allocator/src/large/free_index.hpp): splits, inserts, removes and coalescing keep
// its invariants, coalescing follows its rules, and check_invariants() catches a broken one.
#include "large/free_index.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace cuarena::detail {
namespace {

constexpr std::size_t kGranule = 2 << 20;

struct Fixture {
  explicit Fixture(bool unified) : index(/*segments=*/false, unified) {}
  ~Fixture() {
    for (Block* b = index.firsts().empty() ? nullptr : index.firsts()[0]; b != nullptr;) {
      Block* next = b->next;
      if (b->is_free() || b->retired) index.remove(b);
      index.delete_block(b);
      b = next;
    }
  }
  /// Tiles the arena and cuts allocated blocks of `sizes` granules from its low end.
  std::vector<Block*> carve(const std::vector<std::size_t>& sizes) {
    std::vector<Block*> out;
    Block* rest = index.tile(arena);
    for (std::size_t granules : sizes) {
      index.remove(rest);
      Block* next = index.split_off(rest, rest->addr + granules * kGranule);
      rest->allocated = true;
      rest->shared = false;
      rest->used = true;
      rest->stream = 1;
      out.push_back(rest);
      index.insert(next, nullptr, /*warm=*/false);
      rest = next;
    }
    index.check_invariants();
    return out;
  }
  /// Frees allocated b as owned by its stream and coalesces it with `absorbs` as the rule.
  Block* free_owned(Block* b, bool absorbs_shared, std::uint64_t seq) {
    b->allocated = false;
    b->shared = false;
    b->free_seq = seq;
    index.stream(b->stream).seq = seq;
    Block* m = index.coalesce(
        b, [](const Block*) { return false; },
        [&](const Block*, const Block*) { return absorbs_shared; }, [](const Block*, bool) {});
    index.insert(m);
    index.check_invariants();
    return m;
  }
  Arena arena{0, 16 * kGranule, kGranule};
  FreeIndex index;
};

TEST(FreeIndex, TileSplitAndCoalesceKeepTheInvariants) {
  Fixture f(/*unified=*/false);
  std::vector<Block*> b = f.carve({2, 3, 4});
  EXPECT_EQ(f.index.size(), 1u);  // the tail
  EXPECT_EQ(f.index.shared().size(), 1u);
  // Owned neighbours of one stream merge; the lower block object survives.
  f.free_owned(b[0], false, 1);
  Block* m = f.free_owned(b[1], false, 2);
  EXPECT_EQ(m, b[0]);
  EXPECT_EQ(m->size, 5 * kGranule);
  EXPECT_EQ(m->free_seq, 2u);
  EXPECT_EQ(f.index.stream(1).free.size(), 1u);
  // Own-first rules: an owned block absorbs no shared neighbour.
  Block* last = f.free_owned(b[2], false, 3);
  EXPECT_EQ(last, b[0]);  // merges with the owned one below, not the shared tail above
  EXPECT_EQ(f.index.size(), 2u);
  EXPECT_EQ(f.index.shared().size(), 1u);
  EXPECT_FALSE(last->addressed);  // owned blocks are unaddressed unless unified
  EXPECT_EQ(f.index.addressed_at_or_below(f.arena.base() + 15 * kGranule)->addr,
            9 * kGranule);  // the shared tail
}

TEST(FreeIndex, UnifiedOwnedBlocksAbsorbSharedNeighboursAndStayOwned) {
  Fixture f(/*unified=*/true);
  std::vector<Block*> b = f.carve({2, 3});
  Block* m = f.free_owned(b[1], /*absorbs_shared=*/true, 7);
  EXPECT_EQ(m, b[1]);
  EXPECT_EQ(m->size, 14 * kGranule);  // took the shared tail in
  EXPECT_FALSE(m->shared);
  EXPECT_EQ(m->stream, 1u);
  EXPECT_EQ(m->free_seq, 7u);  // the stream's newest free
  EXPECT_TRUE(m->addressed);   // unified: owned blocks are addressed
  EXPECT_TRUE(f.index.shared().empty());
  EXPECT_EQ(f.index.addressed_at_or_below(m->addr + kGranule), m);
}

TEST(FreeIndex, ABlockThatOwesSharingMergesWithNothing) {
  Fixture f(/*unified=*/false);
  std::vector<Block*> b = f.carve({2, 3, 4});
  f.free_owned(b[0], false, 1);
  b[1]->allocated = false;
  b[1]->free_seq = 2;
  const Block* owed = b[0];
  Block* m = f.index.coalesce(
      b[1], [&](const Block* x) { return x == owed; },
      [](const Block*, const Block*) { return false; }, [](const Block*, bool) {});
  f.index.insert(m);
  EXPECT_EQ(m, b[1]);
  EXPECT_EQ(m->size, 3 * kGranule);
  EXPECT_EQ(f.index.stream(1).free.size(), 2u);
}

TEST(FreeIndex, CheckInvariantsNamesABrokenTiling) {
  Fixture f(/*unified=*/false);
  std::vector<Block*> b = f.carve({2});
  EXPECT_NO_THROW(f.index.check_invariants());
  b[0]->size -= kGranule;  // a gap between the blocks
  EXPECT_THROW(f.index.check_invariants(), std::logic_error);
  b[0]->size += kGranule;
  b[0]->addressed = true;  // an address entry it does not have
  EXPECT_THROW(f.index.check_invariants(), std::logic_error);
  b[0]->addressed = false;
  EXPECT_NO_THROW(f.index.check_invariants());
}

}  // namespace
}  // namespace cuarena::detail
