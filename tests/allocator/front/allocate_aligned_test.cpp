// Allocator::allocate_aligned: the block's address is a multiple of the alignment, the unaligned
// head stays free and usable, and nothing is mapped for it. The shim serves a VMM reservation
// (cuMemAddressReserve with the 2 MiB granularity as alignment, as XLA asks for every buffer)
// with it: a block off the alignment would send the buffer to the driver and double its memory.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

class AllocateAligned : public ::testing::TestWithParam<Mode> {
 protected:
  AllocateAligned() : sim_(options()), a_(sim_, Config::parse(GetParam().config)) {}
  static SimBackend::Options options() { return mode_options(GetParam(), 2 * GiB, /*latency=*/4); }

  SimBackend sim_;
  Allocator a_;
};

TEST_P(AllocateAligned, BlocksStartAtTheAlignmentBehindAnOddOne) {
  // A live block of an odd size first: the next block of the arena starts off every alignment.
  void* odd = a_.allocate(3 * MiB + 512, 0);
  std::vector<void*> live;
  for (std::size_t granules : {1, 5, 16, 2}) {
    void* p = a_.allocate_aligned(granules * 2 * MiB, 2 * MiB, 0);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(addr(p) % (2 * MiB), 0u) << granules << " granules";
    EXPECT_EQ(a_.find(p)->size, granules * 2 * MiB) << "the block is what was asked, no more";
    live.push_back(p);
    a_.check_invariants();
  }
  // Smaller alignments, small sizes: never a slab slot (slots are only 512-byte aligned).
  for (std::size_t alignment : {std::size_t{1024}, 4 * KiB, 64 * KiB}) {
    void* p = a_.allocate_aligned(1000, alignment, 1);
    EXPECT_EQ(addr(p) % alignment, 0u) << alignment;
    live.push_back(p);
  }
  a_.check_invariants();
  for (void* p : live) a_.deallocate(p);
  a_.deallocate(odd);
  a_.check_invariants();
  a_.release_cached();
  EXPECT_EQ(sim_.physical_bytes(), 0u) << "memory leaked";
}

// Modes that map granules on demand (segments are backed whole: there is nothing to leave
// unmapped, so they are not instantiated here).
class AllocateAlignedMapped : public AllocateAligned {};

TEST_P(AllocateAlignedMapped, TheHeadStaysFreeAndCostsNoMemory) {
  void* odd = a_.allocate(2 * MiB + 512 * KiB, 0);  // the head: 1.5 MiB, past the slabs' sizes
  const std::int64_t before = reserved(a_);
  void* p = a_.allocate_aligned(8 * MiB, 2 * MiB, 0);
  ASSERT_EQ(addr(p) % (2 * MiB), 0u);
  // The aligned block needs its own granules and no more: the odd block's last granule, which
  // the head lies in, was already there.
  EXPECT_EQ(reserved(a_) - before, std::int64_t(8 * MiB));
  // The head, between the odd block and the aligned one, serves the next request that fits it.
  const DevicePtr head = addr(odd) + 2 * MiB + 512 * KiB;
  ASSERT_LT(head, addr(p));
  void* q = a_.allocate(addr(p) - head, 0);
  EXPECT_EQ(addr(q), head) << "the head was not left free in place";
  a_.check_invariants();
  for (void* x : {q, p, odd}) a_.deallocate(x);
  a_.check_invariants();
}

TEST_P(AllocateAligned, AFreedAlignedBlockIsReusedAligned) {
  void* odd = a_.allocate(1 * MiB + 512, 0);
  void* p = a_.allocate_aligned(6 * MiB, 2 * MiB, 0);
  a_.deallocate(p);
  const std::int64_t created = a_.stats().num_device_alloc;
  void* again = a_.allocate_aligned(6 * MiB, 2 * MiB, 0);
  EXPECT_EQ(addr(again) % (2 * MiB), 0u);
  EXPECT_EQ(a_.stats().num_device_alloc, created) << "the freed block's memory was not reused";
  a_.deallocate(again);
  a_.deallocate(odd);
  a_.check_invariants();
}

TEST_P(AllocateAligned, NotAPowerOfTwoIsRefusedAndChangesNothing) {
  EXPECT_THROW(a_.allocate_aligned(4 * MiB, 3 * MiB, 0), std::invalid_argument);
  EXPECT_THROW(a_.allocate_aligned(4 * MiB, 0, 0), std::invalid_argument);
  EXPECT_EQ(reserved(a_), 0);
  EXPECT_EQ(a_.stats().allocation[0].current, 0);
  EXPECT_EQ(a_.allocate_aligned(0, 2 * MiB, 0), nullptr);
}

TEST_P(AllocateAligned, TooLargeToEverFitIsOutOfMemory) {
  EXPECT_THROW(a_.allocate_aligned(2 * GiB - 4 * KiB, 1 * GiB, 0), OutOfMemoryError);
  a_.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(Modes, AllocateAligned, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Modes, AllocateAlignedMapped, ::testing::ValuesIn(mapped_modes()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
