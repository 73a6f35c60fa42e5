// The contract suites on the simulator: SimBackend in mapping and in segment mode; the
// Allocator over each upstream the simulator models (vmm, async, malloc); PrivatePool over an
// Allocator. The device lags: a stream kept busy is held (SimBackend::hold_stream) until
// finish_work(), so a reuse that comes before the free completed shows.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "allocator_contract.hpp"
#include "cuarena/sim_backend.hpp"
#include "device_backend_contract.hpp"
#include "private_pool.hpp"

namespace cuarena::conformance {
namespace {

SimBackend::Options sim_options(std::size_t capacity, bool segments) {
  SimBackend::Options o;
  o.capacity = capacity;
  o.segments = segments;
  return o;
}

// The chunk bytes behind [p, p+bytes), granule by granule (an unmapped piece as its address).
Extents sim_extents(const SimBackend& sim, const void* p, std::size_t bytes) {
  Extents out;
  const std::size_t g = sim.granularity();
  for (DevicePtr at = reinterpret_cast<DevicePtr>(p), end = at + bytes; at < end;) {
    const DevicePtr piece_end = std::min<DevicePtr>(end, at / g * g + g);
    const SimBackend::Backing b = sim.backing(at);
    if (b.chunk == 0) {
      out.push_back({0, at, piece_end});
    } else {
      out.push_back({b.chunk, b.offset, b.offset + (piece_end - at)});
    }
    at = piece_end;
  }
  return out;
}

template <bool kSegments>
struct SimBackendHarness {
  static constexpr const char* kName = kSegments ? "segments" : "mapping";
  static constexpr bool kMapping = !kSegments;
  static constexpr bool kEnforcesCapacity = true;
  static std::string skip_reason() { return ""; }
  explicit SimBackendHarness(std::size_t capacity) : sim(sim_options(capacity, kSegments)) {}
  DeviceBackend& backend() { return sim; }
  StreamId stream(int i) { return StreamId(i); }
  void keep_busy(StreamId s) { sim.hold_stream(s); }
  SimBackend sim;
};

using SimBackends = ::testing::Types<SimBackendHarness<false>, SimBackendHarness<true>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Sim, DeviceBackendContract, SimBackends, HarnessName);

template <Upstream U>
struct SimAllocatorHarness : AllocatorHarness {
  static constexpr const char* kName = to_string(U);
  static std::string skip_reason() { return ""; }
  explicit SimAllocatorHarness(std::size_t capacity)
      : sim(sim_options(capacity, U != Upstream::kVmm)),
        alloc(sim, Config::parse(std::string("upstream:") + to_string(U))) {
    a = &alloc;
  }
  StreamId stream(int i) { return StreamId(i); }
  void keep_busy(StreamId s) {
    sim.hold_stream(s);
    held.push_back(s);
    busy_since[s] = sim.now();
  }
  // Made to wait for an event of s recorded since it was kept busy (the busy work then).
  bool ordered_after(StreamId t, StreamId s) const {
    const auto it = busy_since.find(s);
    return it != busy_since.end() && sim.waited_for(t, s, it->second);
  }
  void finish_work() {
    for (StreamId s : held) sim.release_stream(s);
    held.clear();
    for (int i = 0; i < 2; ++i) {
      alloc.process_events();  // records an event on each stream with frees to cover
      sim.advance(1);          // the default event latency: those events complete
    }
    alloc.process_events();
  }
  std::optional<std::size_t> device_bytes() const { return sim.physical_bytes(); }
  Extents physical(const void* p, std::size_t bytes) const { return sim_extents(sim, p, bytes); }

  SimBackend sim;
  Allocator alloc;
  std::vector<StreamId> held;
  std::map<StreamId, std::uint64_t> busy_since;
};

// PrivatePool over an Allocator on the simulator, as the PyTorch adapter builds it.
struct PrivatePoolHarness {
  static constexpr const char* kName = "private_pool";
  static constexpr bool kRecordStream = false;
  static std::string skip_reason() { return ""; }
  explicit PrivatePoolHarness(std::size_t capacity)
      : sim(sim_options(capacity, false)),
        main(sim),
        pool({[this](std::size_t bytes) -> DevicePtr {
                try {
                  void* p = main.allocate_isolated(bytes, 0);
                  segment_bytes += bytes;
                  return reinterpret_cast<DevicePtr>(p);
                } catch (const OutOfMemoryError&) {
                  return 0;
                }
              },
              [this](DevicePtr p, std::size_t bytes) {
                main.deallocate(reinterpret_cast<void*>(p));
                segment_bytes -= bytes;
              }}) {}
  StreamId stream(int i) { return StreamId(i); }
  void* allocate(std::size_t bytes, StreamId s) { return pool.allocate(bytes, s); }
  void deallocate(void* p) { pool.deallocate(p); }
  bool owns(const void* p) const { return pool.owns(p); }
  // The pool reuses a block on another stream only once told every stream is past the frees.
  void keep_busy(StreamId) {}
  bool ordered_after(StreamId, StreamId) const { return false; }  // the pool orders no streams
  void finish_work() { pool.share_free_blocks(); }
  Counts counts() const {
    return {pool.reserved_bytes(), pool.allocated_bytes(), pool.requested_bytes(),
            pool.live_blocks()};
  }
  std::size_t block_size(void* p) const { return pool.block_size(p); }
  std::optional<std::size_t> device_bytes() const { return segment_bytes; }
  void release_cached() { pool.release_free_segments(); }
  void check_invariants() const {
    pool.check_invariants();
    main.check_invariants();
  }
  Extents physical(const void* p, std::size_t bytes) const { return sim_extents(sim, p, bytes); }

  SimBackend sim;
  Allocator main;
  std::size_t segment_bytes = 0;  // segments the pool holds, by the upstream's count
  PrivatePool pool;
};

using SimAllocators =
    ::testing::Types<SimAllocatorHarness<Upstream::kVmm>, SimAllocatorHarness<Upstream::kAsync>,
                     SimAllocatorHarness<Upstream::kMalloc>, PrivatePoolHarness>;
INSTANTIATE_TYPED_TEST_SUITE_P(Sim, AllocatorContract, SimAllocators, HarnessName);

}  // namespace
}  // namespace cuarena::conformance
