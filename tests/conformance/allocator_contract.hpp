// The allocator contract (cuarena/allocator.hpp), one typed suite for every upstream and for
// PrivatePool: stream order, record_stream, clean out-of-memory, null and zero sizes, invalid
// pointers, owns(), statistics.
//
// An allocator joins with a harness type H and INSTANTIATE_TYPED_TEST_SUITE_P(Name,
// AllocatorContract, ::testing::Types<H>, HarnessName). H provides:
//   static constexpr const char* kName;   // the instantiation's name in test names
//   static constexpr bool kRecordStream;  // has record_stream() (PrivatePool: no)
//   static std::string skip_reason();     // "" where it can run (a GPU harness: no device)
//   explicit H(std::size_t capacity);     // over a device of `capacity` bytes
//   StreamId stream(int i);               // distinct streams for i = 1, 2, 3
//   void* allocate(std::size_t, StreamId); void deallocate(void*); bool owns(const void*);
//   void record_stream(void*, StreamId);  // where kRecordStream
//   void keep_busy(StreamId s);           // s has work pending until finish_work()
//   bool ordered_after(StreamId t, StreamId s);  // t's work from now on runs after s's so far
//   void finish_work();                   // every stream catches up and the frees complete
//   Counts counts();                      // reserved, allocated, requested bytes; live blocks
//   std::size_t block_size(void* p);      // the rounded size of the live block at p
//   std::optional<std::size_t> device_bytes();  // what the device says is held, where known
//   void release_cached(); void check_invariants();
//   Extents physical(void* p, std::size_t bytes);  // the memory behind [p, p+bytes)
// AllocatorHarness below implements most of it over a cuarena::Allocator.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/types.hpp"
#include "device_backend_contract.hpp"  // HarnessName

namespace cuarena::conformance {

struct Counts {
  std::size_t reserved = 0, allocated = 0, requested = 0, live = 0;
  bool operator==(const Counts&) const = default;
};

inline void PrintTo(const Counts& c, std::ostream* os) {
  *os << "{reserved " << c.reserved << ", allocated " << c.allocated << ", requested "
      << c.requested << ", live " << c.live << "}";
}

/// Byte ranges of physical memory: (chunk, first byte, end) each. Chunk 0 with addresses where
/// physical memory is its virtual address (no mapping is seen).
struct Extent {
  std::uint64_t chunk, lo, hi;
};
using Extents = std::vector<Extent>;

inline bool overlap(const Extents& a, const Extents& b) {
  for (const Extent& x : a) {
    for (const Extent& y : b) {
      if (x.chunk == y.chunk && x.lo < y.hi && y.lo < x.hi) return true;
    }
  }
  return false;
}

inline Extents virtual_extents(const void* p, std::size_t bytes) {
  const auto lo = reinterpret_cast<std::uint64_t>(p);
  return {{0, lo, lo + bytes}};
}

/// The allocator half of a harness over cuarena::Allocator; the derived harness owns the
/// backend and the Allocator (declared in that order) and sets `a`.
class AllocatorHarness {
 public:
  static constexpr bool kRecordStream = true;
  void* allocate(std::size_t bytes, StreamId s) { return a->allocate(bytes, s); }
  void deallocate(void* p) { a->deallocate(p); }
  void record_stream(void* p, StreamId s) { a->record_stream(p, s); }
  bool owns(const void* p) const { return a->owns(p); }
  Counts counts() const {
    const Stats s = a->stats();
    const int all = int(Pool::kAll);
    return {std::size_t(s.reserved_bytes[all].current), std::size_t(s.allocated_bytes[all].current),
            std::size_t(s.requested_bytes[all].current), std::size_t(s.allocation[all].current)};
  }
  std::size_t block_size(void* p) const {
    const auto info = a->find(p);
    return info ? info->size : 0;
  }
  void release_cached() { a->release_cached(); }
  void check_invariants() const { a->check_invariants(); }

 protected:
  Allocator* a = nullptr;
};

template <class H>
class AllocatorContract : public ::testing::Test {
 protected:
  static constexpr std::size_t kCapacity = 64 * MiB;
  static constexpr std::size_t kBlock = 8 * MiB;  // a large block, several to a device

  void SetUp() override {
    const std::string why = H::skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    h = std::make_unique<H>(kCapacity);
  }
  void TearDown() override {
    if (h) {
      EXPECT_NO_THROW(h->check_invariants());
    }
  }
  /// Reserved bytes agree with what the device holds, where the harness knows it.
  void expect_device_agrees() {
    if (const auto held = h->device_bytes()) {
      EXPECT_EQ(*held, h->counts().reserved) << "reserved bytes differ from the device's";
    }
  }

  std::unique_ptr<H> h;
};

TYPED_TEST_SUITE_P(AllocatorContract);

TYPED_TEST_P(AllocatorContract, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  auto& h = *this->h;
  const Counts before = h.counts();
  EXPECT_EQ(h.allocate(0, h.stream(1)), nullptr);
  EXPECT_NO_THROW(h.deallocate(nullptr));
  EXPECT_FALSE(h.owns(nullptr));
  EXPECT_EQ(h.counts(), before);
}

// Blocks of every size class are 512-aligned, never share memory, belong to the allocator, and
// the statistics add up to them.
TYPED_TEST_P(AllocatorContract, BlocksAreAlignedDisjointOwnedAndCounted) {
  auto& h = *this->h;
  struct Live {
    void* p;
    std::size_t bytes;
  };
  std::vector<Live> blocks;
  std::size_t requested = 0, allocated = 0;
  int i = 0;
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{512}, std::size_t{1000}, 4096 * std::size_t{3},
        std::size_t{100000}, MiB, MiB + 1, 3 * MiB, this->kBlock}) {
    void* p = h.allocate(bytes, h.stream(1 + i++ % 2));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u) << bytes << " bytes";
    EXPECT_TRUE(h.owns(p));
    EXPECT_GE(h.block_size(p), bytes);
    for (const Live& b : blocks) {
      EXPECT_FALSE(overlap(virtual_extents(p, bytes), virtual_extents(b.p, b.bytes)))
          << "addresses overlap";
      EXPECT_FALSE(overlap(h.physical(p, bytes), h.physical(b.p, b.bytes)))
          << "live blocks of " << bytes << " and " << b.bytes << " bytes share memory";
    }
    blocks.push_back({p, bytes});
    requested += bytes;
    allocated += h.block_size(p);
  }
  const Counts c = h.counts();
  EXPECT_EQ(c.live, blocks.size());
  EXPECT_EQ(c.requested, requested);
  EXPECT_EQ(c.allocated, allocated);
  EXPECT_GE(c.reserved, c.allocated);
  this->expect_device_agrees();
  int on_host = 0;
  EXPECT_FALSE(h.owns(&on_host));
  h.check_invariants();
  for (const Live& b : blocks) h.deallocate(b.p);
  const Counts after = h.counts();
  EXPECT_EQ(after.live, 0u);
  EXPECT_EQ(after.allocated, 0u);
  EXPECT_EQ(after.requested, 0u);
  EXPECT_TRUE(h.owns(blocks.back().p)) << "cached memory is still this allocator's";
  h.finish_work();
  h.release_cached();
  EXPECT_EQ(h.counts().reserved, 0u) << "release_cached kept memory no block uses";
  this->expect_device_agrees();
}

// A block freed on a stream is reusable at once on that stream, the device still behind.
TYPED_TEST_P(AllocatorContract, TheFreeingStreamReusesAtOnce) {
  auto& h = *this->h;
  const StreamId s = h.stream(1);
  void* p = h.allocate(this->kBlock, s);
  h.keep_busy(s);
  h.deallocate(p);
  const std::size_t reserved = h.counts().reserved;
  void* q = h.allocate(this->kBlock, s);
  EXPECT_EQ(q, p);
  EXPECT_EQ(h.counts().reserved, reserved) << "new memory for a block its stream just freed";
  h.deallocate(q);
  h.finish_work();
}

// Another stream gets a freed block's memory only once the freeing stream is past the free, or
// made to wait for it on the device (internal dependencies).
TYPED_TEST_P(AllocatorContract, AnotherStreamWaitsForTheFree) {
  auto& h = *this->h;
  const StreamId s = h.stream(1), t = h.stream(2);
  void* p = h.allocate(this->kBlock, s);
  const Extents freed = h.physical(p, this->kBlock);
  h.keep_busy(s);
  h.deallocate(p);
  void* q = h.allocate(this->kBlock, t);
  ASSERT_NE(q, nullptr);
  const bool took_it = overlap(h.physical(q, this->kBlock), freed);
  if (took_it) {
    EXPECT_TRUE(h.ordered_after(t, s))
        << "stream 2 got memory stream 1 freed before stream 1 was past the free, unordered";
  }
  h.finish_work();
  if (!took_it) {  // grew instead: once stream 1 is past the free, stream 2 reuses it
    const std::size_t reserved = h.counts().reserved;
    void* r = h.allocate(this->kBlock, t);
    EXPECT_EQ(h.counts().reserved, reserved) << "the completed free was not reused by stream 2";
    h.deallocate(r);
  }
  h.deallocate(q);
  h.finish_work();
}

// A block used on another stream (record_stream) is reused by no one, its own stream included,
// until that stream is past the free; then it is.
TYPED_TEST_P(AllocatorContract, RecordStreamDelaysReuseUntilThatStreamIsDone) {
  if constexpr (TypeParam::kRecordStream) {
    auto& h = *this->h;
    const StreamId s = h.stream(1), t = h.stream(2);
    void* p = h.allocate(this->kBlock, s);
    const Extents used = h.physical(p, this->kBlock);
    h.record_stream(p, t);
    h.keep_busy(t);
    h.deallocate(p);
    EXPECT_THROW(h.record_stream(p, t), InvalidPointerError) << "record_stream after the free";
    for (StreamId u : {s, h.stream(3)}) {
      void* q = h.allocate(this->kBlock, u);
      EXPECT_FALSE(overlap(h.physical(q, this->kBlock), used))
          << "reused while stream 2 may still be using it";
      h.deallocate(q);
    }
    h.finish_work();
    const std::size_t reserved = h.counts().reserved;
    void* r = h.allocate(this->kBlock, s);
    void* r2 = h.allocate(this->kBlock, s);
    EXPECT_EQ(h.counts().reserved, reserved) << "the block stayed held after stream 2 was done";
    h.deallocate(r);
    h.deallocate(r2);
    h.finish_work();
  } else {
    SUCCEED() << "no record_stream (kRecordStream false)";
  }
}

// Out of memory: a typed OutOfMemoryError naming the request; no live block lost, no bytes
// leaked; the allocator keeps serving once memory is freed.
TYPED_TEST_P(AllocatorContract, OutOfMemoryIsCleanAndTheAllocatorStaysUsable) {
  auto& h = *this->h;
  const StreamId s = h.stream(1);
  std::vector<void*> blocks;
  bool oom = false;
  for (int i = 0; i < 64 && !oom; ++i) {
    const Counts before = h.counts();
    try {
      blocks.push_back(h.allocate(this->kBlock, s));
    } catch (const OutOfMemoryError& e) {
      oom = true;
      EXPECT_EQ(e.requested_bytes(), this->kBlock);
      const Counts after = h.counts();
      EXPECT_EQ(after.live, before.live);
      EXPECT_EQ(after.allocated, before.allocated);
      EXPECT_EQ(after.requested, before.requested);
      EXPECT_LE(after.reserved, before.reserved) << "the failed request kept memory";
    }
  }
  ASSERT_TRUE(oom) << "64 blocks of 8 MiB fit a 64 MiB device";
  EXPECT_GE(blocks.size(), 4u) << "out of memory far below the capacity";
  this->expect_device_agrees();
  h.check_invariants();
  EXPECT_THROW(h.allocate(2 * this->kCapacity, s), OutOfMemoryError);
  h.deallocate(blocks.back());
  blocks.pop_back();
  void* again = nullptr;
  EXPECT_NO_THROW(again = h.allocate(this->kBlock, s)) << "freeing did not make room";
  if (again) blocks.push_back(again);
  for (void* p : blocks) h.deallocate(p);
  h.finish_work();
  h.release_cached();
  EXPECT_EQ(h.counts(), Counts{}) << "memory lost to the out-of-memory path";
  this->expect_device_agrees();
}

// A pointer that is no live block's start is refused with InvalidPointerError and changes
// nothing.
TYPED_TEST_P(AllocatorContract, InvalidPointersAreRefusedAndChangeNothing) {
  auto& h = *this->h;
  void* p = h.allocate(this->kBlock, h.stream(1));
  void* q = h.allocate(this->kBlock, h.stream(1));
  h.deallocate(q);
  const Counts before = h.counts();
  int on_host = 0;
  EXPECT_THROW(h.deallocate(&on_host), InvalidPointerError);
  EXPECT_THROW(h.deallocate(static_cast<char*>(p) + 512), InvalidPointerError);
  EXPECT_THROW(h.deallocate(q), InvalidPointerError);  // freed already
  if constexpr (TypeParam::kRecordStream) {
    EXPECT_THROW(h.record_stream(&on_host, h.stream(2)), InvalidPointerError);
  }
  EXPECT_EQ(h.counts(), before);
  h.check_invariants();
  h.deallocate(p);
  h.finish_work();
}

REGISTER_TYPED_TEST_SUITE_P(AllocatorContract, ZeroBytesIsNullAndFreeingNullIsANoOp,
                            BlocksAreAlignedDisjointOwnedAndCounted, TheFreeingStreamReusesAtOnce,
                            AnotherStreamWaitsForTheFree,
                            RecordStreamDelaysReuseUntilThatStreamIsDone,
                            OutOfMemoryIsCleanAndTheAllocatorStaysUsable,
                            InvalidPointersAreRefusedAndChangeNothing);

}  // namespace cuarena::conformance
