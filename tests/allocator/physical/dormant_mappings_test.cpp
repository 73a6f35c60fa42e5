// Dormant mappings (config dormant_maps): a granule stolen for another address keeps its old
// mapping, and the old address takes it back with no driver call once it is free again.
#include <gtest/gtest.h>

#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

// Stream 1 holds an 8 MiB block A (4 granules) between two pins, frees it, and the device
// finishes; then stream 2 asks for 60 MiB. Reuse comes before growth (the default), so A's
// granules move under the new block.
struct Moved {
  SimBackend sim;
  Allocator a;
  void* pin_low = nullptr;
  void* block_a = nullptr;
  void* pin_high = nullptr;
  void* big = nullptr;
  explicit Moved(const std::string& config, std::size_t capacity = 72 * MiB)
      : sim(sim_options(capacity)),
        a(sim, Config::parse("small_limit:512,sweep_interval:1," + config)) {
    pin_low = a.allocate(2 * MiB, 1);
    block_a = a.allocate(8 * MiB, 1);
    pin_high = a.allocate(2 * MiB, 1);
    a.deallocate(block_a);
    a.process_events();
    sim.advance(10);
    big = a.allocate(64 * MiB, 2);  // with the 4 MiB of pins: 68 MiB of the 72 MiB limit
  }
};

}  // namespace

TEST(Dormant, AMovedGranuleComesBackWithNoDriverCall) {
  Moved m("");
  Allocator& a = m.a;
  EXPECT_GE(a.stats().granules_stolen, 4);
  EXPECT_EQ(m.sim.unmap_calls(), 0u) << "stealing left the old mappings in place";
  EXPECT_TRUE(m.sim.is_mapped(addr(m.block_a), 8 * MiB));
  a.check_invariants();
  a.deallocate(m.big);
  a.process_events();
  m.sim.advance(10);
  const std::size_t maps = m.sim.map_calls(), unmaps = m.sim.unmap_calls();
  void* again = a.allocate(8 * MiB, 1);  // best fit: A's old block, still mapped dormant
  EXPECT_EQ(again, m.block_a);
  EXPECT_EQ(m.sim.map_calls(), maps);
  EXPECT_EQ(m.sim.unmap_calls(), unmaps);
  EXPECT_EQ(a.stats().granules_reactivated, 4);
  EXPECT_TRUE(m.sim.is_mapped(addr(again), 8 * MiB));
  EXPECT_LE(m.sim.physical_bytes(), 72 * MiB);
  a.check_invariants();
  a.deallocate(again);
  a.deallocate(m.pin_low);
  a.deallocate(m.pin_high);
  a.release_cached();
  EXPECT_EQ(m.sim.physical_bytes(), 0u) << "dormant mappings kept chunks alive";
  a.check_invariants();
}

TEST(Dormant, ABusyGranuleIsNeverTakenBack) {
  {
    // The big block holds A's granules and the limit is reached: A's address cannot be backed.
    Moved m("");
    EXPECT_THROW(m.a.allocate(8 * MiB, 1), OutOfMemoryError);
    EXPECT_EQ(m.a.stats().granules_reactivated, 0);
    m.a.check_invariants();
  }
  // With room, A's address gets fresh granules: its dormant mappings are unmapped first.
  Moved m("", 1 * GiB);
  const std::size_t unmaps = m.sim.unmap_calls();
  void* again = m.a.allocate(8 * MiB, 1);
  EXPECT_EQ(again, m.block_a);
  EXPECT_EQ(m.a.stats().granules_reactivated, 0);
  EXPECT_GE(m.sim.unmap_calls(), unmaps + 1);
  for (std::size_t off = 0; off < 8 * MiB; off += kGranule) {
    const SimBackend::Backing mine = m.sim.backing(addr(again) + off);
    for (std::size_t o = 0; o < 64 * MiB; o += kGranule) {
      const SimBackend::Backing theirs = m.sim.backing(addr(m.big) + o);
      EXPECT_FALSE(mine.chunk == theirs.chunk && mine.offset / kGranule == theirs.offset / kGranule)
          << "two live blocks share a physical granule";
    }
  }
  m.a.check_invariants();
}

TEST(Dormant, ZeroUnmapsAtOnce) {
  Moved m("dormant_maps:0");
  EXPECT_GE(m.sim.unmap_calls(), 1u);
  EXPECT_FALSE(m.sim.is_mapped(addr(m.block_a), 8 * MiB));
  m.a.check_invariants();
}

TEST(Dormant, TheCapUnmapsTheOldestMapping) {
  // One dormant mapping per granule. Each block is a little larger than the last and pinned
  // above by a block larger still (so the pin cannot land in an older free block): every new
  // block lies past the others and takes its predecessor's granules. By the third, they move a
  // second time, and their first address must be unmapped.
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim,
              Config::parse("small_limit:512,sweep_interval:1,dormant_maps:1,whole_chunk_min:0"));
  std::vector<void*> blocks, pins;
  std::size_t size = 8 * MiB;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(a.allocate(size, 1));
    pins.push_back(a.allocate(size + 512, 1));
    size += 1024;
    if (i == 1) {
      EXPECT_EQ(sim.unmap_calls(), 0u) << "one move leaves one dormant mapping";
    }
    a.deallocate(blocks.back());
    a.process_events();
    sim.advance(10);
    a.check_invariants();
  }
  EXPECT_GE(a.stats().granules_stolen, 6);
  EXPECT_GE(sim.unmap_calls(), 1u);
  EXPECT_FALSE(sim.is_mapped(addr(blocks[0]) + kGranule, kGranule))
      << "a granule kept two dormant mappings";
  for (void* p : pins) a.deallocate(p);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
  a.check_invariants();
}
