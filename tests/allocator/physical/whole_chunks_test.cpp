// Whole chunks (config whole_chunk_min, whole_chunk_max): long runs of fresh granules become
// backend chunks of several granules, mapped, moved and unmapped only whole (SimBackend throws
// otherwise). A chunk is at most 32 MiB while less than 512 MiB is reserved.
#include <gtest/gtest.h>

#include <string>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

TEST(WholeChunk, ALongRunIsOneChunkAndOneMap) {
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("whole_chunk_min:8MiB"));
  void* p = a.allocate(32 * MiB, 0);
  EXPECT_EQ(sim.live_chunks(), 1u);
  EXPECT_EQ(sim.map_calls(), 1u);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  a.deallocate(p);
  void* q = a.allocate(32 * MiB, 0);  // reused in place: no new call
  EXPECT_EQ(q, p);
  EXPECT_EQ(sim.map_calls(), 1u);
  a.deallocate(q);
  a.check_invariants();
}

TEST(WholeChunk, ALongerRunIsCutIntoEqualChunks) {
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("whole_chunk_min:8MiB,whole_chunk_max:24MiB"));
  void* p = a.allocate(64 * MiB, 0);  // 32 granules: two chunks of 11 and one of 10
  EXPECT_EQ(sim.live_chunks(), 3u);
  EXPECT_EQ(sim.map_calls(), 3u);
  EXPECT_TRUE(sim.is_mapped(addr(p), 64 * MiB));
  a.deallocate(p);
  a.check_invariants();
}

// Past 75% of the limit the pool turns memory-first (single granules, one best fit over every
// block) and stays so while it holds much; an empty_cache() that leaves it under half of that
// turns it back: whole chunks again. A pool configured memory-first stays so.
TEST(WholeChunk, TheTurnToMemoryFirstLastsUntilAnEmptyCacheLeavesLittle) {
  SimBackend sim(sim_options(100 * MiB));
  Allocator a(sim, Config::parse("small_limit:512,whole_chunk_min:4MiB"));
  void* big = a.allocate(40 * MiB, 1);  // whole chunks
  const std::size_t whole = sim.live_whole_chunks();
  EXPECT_GE(whole, 1u);
  EXPECT_EQ(a.stats().memory_first, 0);
  void* b = a.allocate(50 * MiB, 1);  // 90 MiB: past 75 MiB
  EXPECT_EQ(a.stats().memory_first, 1);
  a.check_invariants();
  a.deallocate(b);
  a.release_cached();  // 40 MiB still held: above half of 75 MiB, so it stays
  EXPECT_EQ(a.stats().memory_first, 1);
  const std::size_t chunks = sim.live_chunks();
  void* c = a.allocate(16 * MiB, 1);  // fresh memory in single granules: one movable chunk
  EXPECT_EQ(sim.live_whole_chunks(), whole);
  EXPECT_EQ(sim.live_chunks(), chunks + 1);
  a.check_invariants();
  a.deallocate(c);
  a.deallocate(big);
  a.release_cached();  // nothing held: back to whole chunks
  EXPECT_EQ(a.stats().memory_first, 0);
  a.check_invariants();
  void* d = a.allocate(32 * MiB, 1);  // a whole chunk again
  EXPECT_EQ(sim.live_whole_chunks(), 1u);
  EXPECT_EQ(sim.live_chunks(), 1u);
  a.deallocate(d);
  a.check_invariants();

  SimBackend sim2(sim_options(100 * MiB));
  Allocator mf(sim2, Config::parse("small_limit:512,whole_chunk_min:0"));
  mf.deallocate(mf.allocate(82 * MiB, 1));
  mf.release_cached();
  EXPECT_EQ(mf.stats().memory_first, 1);
}

TEST(WholeChunk, NearTheLimitFreshMemoryComesInSingleGranules) {
  // 32 MiB as one whole chunk; then 50 MiB would pass 75% of the 100 MiB limit, so it comes in
  // single granules, which can move wherever they are needed.
  SimBackend sim(sim_options(100 * MiB));
  Allocator a(sim, Config::parse("small_limit:512,whole_chunk_min:4MiB"));
  void* big = a.allocate(32 * MiB, 1);
  EXPECT_EQ(sim.live_whole_chunks(), 1u);
  void* b = a.allocate(50 * MiB, 1);
  EXPECT_EQ(sim.live_whole_chunks(), 1u);
  EXPECT_EQ(sim.live_chunks(), 2u);
  a.check_invariants();
  for (void* p : {big, b}) a.deallocate(p);
  // With whole_chunk_fraction:1, whole chunks up to the limit (50 MiB: two of 25 MiB).
  SimBackend sim2(sim_options(100 * MiB));
  Allocator a2(sim2, Config::parse("small_limit:512,whole_chunk_fraction:1,whole_chunk_min:4MiB"));
  void* big2 = a2.allocate(32 * MiB, 1);
  void* b2 = a2.allocate(50 * MiB, 1);
  EXPECT_EQ(sim2.live_whole_chunks(), 3u);
  for (void* p : {big2, b2}) a2.deallocate(p);
}

TEST(WholeChunk, ShortRunsStayMovableGranules) {
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("whole_chunk_min:16MiB"));
  void* p = a.allocate(6 * MiB, 0);  // 3 granules < 8: one chunk of movable granules
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  a.deallocate(p);
  a.check_invariants();
  Allocator b(sim, Config::parse("whole_chunk_min:0"));
  void* r = b.allocate(64 * MiB, 0);
  b.deallocate(r);
  b.check_invariants();
}

TEST(WholeChunk, AStolenWholeChunkMovesAsOnePiece) {
  SimBackend sim(sim_options(100 * MiB));
  Allocator a(sim, Config::parse("whole_chunk_min:8MiB,sweep_interval:1,small_limit:512"));
  void* p = a.allocate(64 * MiB, 1);
  void* pin = a.allocate(2 * MiB, 1);  // keeps p's block from merging with the space above
  const PhysHandle low = sim.backing(addr(p)).chunk, high = sim.backing(addr(p) + 32 * MiB).chunk;
  a.deallocate(p);
  a.process_events();
  sim.advance(10);
  // Stream 2 cannot reuse p's block in place (it asks for more than p had), so p's two whole
  // chunks are mapped, whole, under the new block: no release, no new chunk for their bytes.
  const std::size_t maps = sim.map_calls();
  void* q = a.allocate(90 * MiB, 2);
  EXPECT_TRUE(sim.is_mapped(addr(q), 90 * MiB));
  const PhysHandle q_low = sim.backing(addr(q)).chunk,
                   q_high = sim.backing(addr(q) + 32 * MiB).chunk;
  EXPECT_TRUE((q_low == low && q_high == high) || (q_low == high && q_high == low));
  EXPECT_EQ(sim.map_calls(), maps + 3) << "the two moved chunks and one fresh chunk";
  EXPECT_LE(sim.physical_bytes(), 92 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 0);
  EXPECT_GE(a.stats().granules_stolen, 32);
  a.check_invariants();
  a.deallocate(q);
  a.deallocate(pin);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
  a.check_invariants();
}

TEST(WholeChunk, AWholeChunkThatFitsNowhereIsReleasedBeforeGrowing) {
  SimBackend sim(sim_options(200 * MiB));
  Allocator a(sim, Config::parse("whole_chunk_min:8MiB,sweep_interval:1,small_limit:512"));
  void* p1 = a.allocate(32 * MiB, 1);
  void* pin1 = a.allocate(2 * MiB, 1);
  void* p2 = a.allocate(32 * MiB, 1);
  void* pin2 = a.allocate(2 * MiB, 1);
  a.deallocate(p1);
  a.deallocate(p2);
  a.process_events();
  sim.advance(10);
  // 24 granules: one 16-granule chunk moves under it; the other cannot back the 8 left, so it
  // is released and 8 granules are created in its place: memory stays flat.
  void* q = a.allocate(48 * MiB, 2);
  EXPECT_TRUE(sim.is_mapped(addr(q), 48 * MiB));
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_LE(sim.physical_bytes(), 52 * MiB);
  a.check_invariants();
  for (void* x : {q, pin1, pin2}) a.deallocate(x);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

TEST(WholeChunk, PartOfAWholeChunkIsNeverUnmapped) {
  SimBackend sim(sim_options(1 * GiB));
  Allocator a(sim, Config::parse("whole_chunk_min:8MiB,sweep_interval:1,small_limit:512"));
  void* big = a.allocate(64 * MiB, 1);
  a.deallocate(big);
  void* low = a.allocate(16 * MiB, 1);  // splits the free block: the chunk is now shared by two
  a.process_events();
  sim.advance(10);
  // A shortage with a partly used whole chunk cached: it must not be cut (SimBackend would throw).
  std::vector<void*> more;
  try {
    for (int i = 0; i < 64; ++i) more.push_back(a.allocate(32 * MiB, 2));
  } catch (const OutOfMemoryError&) {
  }
  EXPECT_FALSE(more.empty());
  a.check_invariants();
  for (void* m : more) a.deallocate(m);
  a.deallocate(low);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}
