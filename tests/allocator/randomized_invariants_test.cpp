// Randomized invariant tests over several streams, checked against a simple model of what should
// be live: short scenarios check everything after every operation, long ones (over a million
// operations in all) every kCheckEvery operations and at the end, and loops of identical
// iterations check that a training loop's memory stops growing. Every operation also checks
// stream order: memory freed on one stream reaches another (or any stream, after record_stream)
// only once the device has passed the free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

struct Live {
  std::size_t requested;
  StreamId stream;
  bool used_elsewhere = false;  // record_stream for another stream long before the free
};

struct Scenario {
  const char* name;
  std::size_t capacity;
  std::uint64_t latency;
  const char* config;
  int ops;
};

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class Randomized : public ::testing::TestWithParam<std::tuple<Scenario, unsigned>> {};

// Sizes spanning slabs and large blocks, log-uniform from 1 B to 64 MiB.
std::size_t random_size(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> exp2(0.0, 26.0);
  return std::max<std::size_t>(1, std::size_t(std::exp2(exp2(rng))));
}

// Sizes near whole granules (1-9 MiB in 512-byte steps, a quarter of them just short of one),
// with a large block one time in 8: whole chunks are aliased whole and leave parts behind.
std::size_t granular_size(std::mt19937_64& rng) {
  if (rng() % 8 == 0) return 1 + rng() % (64 * MiB);
  const std::size_t bytes = 512 * (2048 + rng() % 16384);
  return rng() % 4 == 0 ? bytes - rng() % 512 : bytes;
}
using SizeFn = std::size_t (*)(std::mt19937_64&);

// Sanitizers make each operation ~10x slower (and the asan preset also checks the core's
// structures at every call): the long runs are cut by this factor there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kSanitizerScale = 20;
constexpr int kShortSanitizerScale = 2;  // the short runs, checked whole after every operation
#else
constexpr int kSanitizerScale = 1;
constexpr int kShortSanitizerScale = 1;
#endif

// A scenario this small must run out of memory at least once (OOM handling is exercised).
constexpr std::size_t kTightCapacity = 512 * MiB;

// Stream order, at the level of physical bytes: bytes freed on stream S at tick t may back a new
// block on another stream, or on any stream when the free had record_stream uses, only once an
// event recorded at t has completed, i.e. at tick t + latency or later (a host wait moves the
// simulated clock there). Remembers frees for `latency` ticks.
// Forwards to a SimBackend and holds the core to unmap()'s precondition: no pending device work
// uses the range through those addresses. A block's bytes are in use while it is live, and for
// `latency` ticks after its free (its stream's kernels may still run: on a GPU, unmapping them
// then is an illegal address). `broken` says the first violation.
class UnmapGuard final : public ForwardingBackend {
 public:
  UnmapGuard(SimBackend& sim, std::uint64_t latency) : ForwardingBackend(sim), latency_(latency) {}

  void allocated(DevicePtr p, std::size_t size) { live_[p] = p + size; }
  void freed(DevicePtr p) {
    recent_.push_back({p, live_.at(p), sim_.now()});
    live_.erase(p);
  }
  std::string broken;

  void unmap(DevicePtr va, std::size_t b) override {
    check(va, va + b);
    sim_.unmap(va, b);
  }

 private:
  struct Freed {
    DevicePtr lo, hi;
    std::uint64_t tick;
  };
  void check(DevicePtr lo, DevicePtr hi) {
    std::erase_if(recent_, [&](const Freed& f) { return f.tick + latency_ <= sim_.now(); });
    if (!broken.empty()) return;
    auto it = live_.upper_bound(lo);
    if (it != live_.begin() && std::prev(it)->second > lo) it = std::prev(it);
    if (it != live_.end() && it->first < hi) {
      broken = "unmapped " + hex(lo) + "-" + hex(hi) + " under the live block at " + hex(it->first);
      return;
    }
    for (const Freed& f : recent_) {
      if (f.lo < hi && lo < f.hi) {
        broken = "unmapped " + hex(lo) + "-" + hex(hi) + " at tick " + std::to_string(sim_.now()) +
                 " under a block freed at tick " + std::to_string(f.tick) +
                 ", before the device got there";
        return;
      }
    }
  }
  static std::string hex(DevicePtr p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(p));
    return buf;
  }

  std::uint64_t latency_;
  std::map<DevicePtr, DevicePtr> live_;  // block start -> end
  std::vector<Freed> recent_;
};

class ReuseGuard {
 public:
  ReuseGuard(const SimBackend& sim, std::uint64_t latency) : sim_(sim), latency_(latency) {}

  void freed(DevicePtr ptr, std::size_t size, StreamId stream, bool uses) {
    for_pieces(ptr, size, [&](Key key, std::size_t lo, std::size_t hi) {
      recent_[key].push_back({sim_.now(), stream, uses, lo, hi});
      expiry_.push_back({sim_.now(), key});
    });
  }

  // Returns "" or what broke stream order.
  std::string allocated(DevicePtr ptr, std::size_t size, StreamId stream) {
    expire();
    std::string broken;
    for_pieces(ptr, size, [&](Key key, std::size_t lo, std::size_t hi) {
      auto it = recent_.find(key);
      if (it == recent_.end() || !broken.empty()) return;
      for (const Freed& f : it->second) {
        // Safe once the free's event completed, or (another stream's plain free) once this
        // stream was made to wait for an event recorded at or after the free.
        const bool ordered =
            !f.uses && f.stream != stream && sim_.waited_for(stream, f.stream, f.tick);
        if ((f.stream != stream || f.uses) && lo < f.hi && f.lo < hi &&
            sim_.now() < f.tick + latency_ && !ordered) {
          broken = "bytes freed on stream " + std::to_string(f.stream) + " at tick " +
                   std::to_string(f.tick) + (f.uses ? " (with record_stream uses)" : "") +
                   " back a block of stream " + std::to_string(stream) + " at tick " +
                   std::to_string(sim_.now()) + ", before the free's event completes";
          return;
        }
      }
    });
    return broken;
  }

 private:
  using Key = std::pair<PhysHandle, std::size_t>;  // chunk, granule in it
  struct Freed {
    std::uint64_t tick;
    StreamId stream;
    bool uses;
    std::size_t lo, hi;  // bytes in the chunk
  };

  template <class Fn>
  void for_pieces(DevicePtr ptr, std::size_t size, Fn&& fn) const {
    for (DevicePtr at = ptr; at < ptr + size;) {
      const DevicePtr end = std::min<DevicePtr>(ptr + size, (at / kGranule + 1) * kGranule);
      const SimBackend::Backing b = sim_.backing(at);
      if (b.chunk != 0) fn(Key{b.chunk, b.offset / kGranule}, b.offset, b.offset + (end - at));
      at = end;
    }
  }

  void expire() {
    while (!expiry_.empty() && expiry_.front().first + latency_ <= sim_.now()) {
      auto it = recent_.find(expiry_.front().second);
      if (it != recent_.end()) {
        auto& v = it->second;
        v.erase(std::remove_if(v.begin(), v.end(),
                               [&](const Freed& f) { return f.tick + latency_ <= sim_.now(); }),
                v.end());
        if (v.empty()) recent_.erase(it);
      }
      expiry_.pop_front();
    }
  }

  const SimBackend& sim_;
  std::uint64_t latency_;
  std::map<Key, std::vector<Freed>> recent_;
  std::deque<std::pair<std::uint64_t, Key>> expiry_;
};

void check_against_model(const Allocator& a, const SimBackend& sim,
                         const std::map<DevicePtr, Live>& model) {
  ASSERT_NO_THROW(a.check_invariants());
  auto blocks = a.live_blocks();
  ASSERT_EQ(blocks.size(), model.size());
  std::sort(blocks.begin(), blocks.end(), [](auto& x, auto& y) { return x.ptr < y.ptr; });
  std::int64_t requested = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    auto it = model.find(b.ptr);
    ASSERT_NE(it, model.end());
    ASSERT_EQ(b.requested, it->second.requested);
    ASSERT_EQ(b.stream, it->second.stream);
    ASSERT_GE(b.size, b.requested);
    ASSERT_EQ(b.ptr % 512, 0u);
    if (i + 1 < blocks.size()) {
      ASSERT_LE(b.ptr + b.size, blocks[i + 1].ptr) << "live blocks overlap";
    }
    ASSERT_TRUE(sim.is_mapped(b.ptr, b.size)) << "live block not backed by mapped memory";
    requested += std::int64_t(b.requested);
  }
  // No two live blocks share physical bytes, however granules moved, aliased or lay dormant.
  if (sim.supports_mapping()) {
    std::map<std::pair<PhysHandle, std::size_t>, DevicePtr> owner;  // (chunk, offset) -> block
    std::vector<std::pair<std::pair<PhysHandle, std::size_t>, std::pair<std::size_t, DevicePtr>>>
        pieces;
    for (const auto& b : blocks) {
      for (DevicePtr at = b.ptr; at < b.ptr + b.size;) {
        const DevicePtr granule_end = (at / kGranule + 1) * kGranule;
        const DevicePtr end = std::min<DevicePtr>(b.ptr + b.size, granule_end);
        const SimBackend::Backing k = sim.backing(at);
        pieces.push_back({{k.chunk, k.offset}, {end - at, b.ptr}});
        at = end;
      }
    }
    std::sort(pieces.begin(), pieces.end());
    for (std::size_t i = 0; i + 1 < pieces.size(); ++i) {
      const auto& [key, len_block] = pieces[i];
      const auto& next = pieces[i + 1];
      if (next.first.first == key.first) {
        ASSERT_LE(key.second + len_block.first, next.first.second)
            << "live blocks " << len_block.second << " and " << next.second.second
            << " share physical memory";
      }
    }
  }
  const Stats s = a.stats();
  ASSERT_EQ(s.requested_bytes[0].current, requested);
  ASSERT_EQ(s.allocation[0].current, std::int64_t(model.size()));
  ASSERT_EQ(s.reserved_bytes[0].current, std::int64_t(sim.physical_bytes()));
  {  // where each reserved byte is: the parts add up to the whole (segment mode too)
    const auto m = a.memory_breakdown();
    ASSERT_EQ(m.in_use + m.owned_cached + m.shared_cached + m.retired + m.idle,
              sim.physical_bytes());
  }
  ASSERT_LE(sim.physical_bytes(), sim.capacity());
}

// Runs `sc` with `seed` over `streams` streams; checks everything every `check_every`
// operations (1: after each) and at the end. Allocations 55% while fewer than `max_live` blocks
// are live (else 40%), frees the rest (a fifth of them after record_stream on another stream),
// process_events now and then, release_cached every 997.
// `capture`: now and then one stream is captured into a graph (SimBackend::begin_capture) for a
// while, and treated as PyTorch's adapter treats it: no allocation on it (a private pool serves
// those), no free of its blocks (deferred past the capture), no record_stream for it; any event
// the allocator records there, or wait it makes there, throws.
void run_scenario(const Scenario& sc, unsigned seed, int ops, int check_every, unsigned streams,
                  std::size_t max_live = SIZE_MAX, bool capture = false) {
  std::mt19937_64 rng(seed);
  const Config config = Config::parse(sc.config);
  SimBackend::Options so = sim_options(sc.capacity, sc.latency);
  so.segments = config.upstream != Upstream::kVmm;  // the segment upstreams' core path
  SimBackend sim(so);
  UnmapGuard unmaps(sim, sc.latency);
  Allocator a(unmaps, config);
  ReuseGuard guard(sim, sc.latency);
  std::map<DevicePtr, Live> model;
  std::vector<DevicePtr> order;
  std::size_t ooms = 0, cross_frees = 0, aligned = 0;
  bool turned = false;  // the pool placed memory-first at some point
  constexpr StreamId kNone = ~StreamId{0};
  StreamId captured = kNone;
  int capture_ends = 0, captures = 0;
  for (int op = 0; op < ops; ++op) {
    sim.advance(1);
    if (capture && captured == kNone && rng() % 150 == 0) {
      captured = rng() % streams;
      capture_ends = op + 20 + int(rng() % 300);
      sim.begin_capture(captured);
      ++captures;
    } else if (captured != kNone && op >= capture_ends) {
      sim.end_capture(captured);
      captured = kNone;
    }
    const int dice = int(rng() % 100);
    const StreamId stream = rng() % streams;
    if (stream == captured) continue;
    if (dice < (model.size() < max_live ? 55 : 40) || model.empty()) {
      const std::size_t bytes = random_size(rng);
      // One in ten at an alignment of 1 KiB to 2 MiB (allocate_aligned: a VMM range's).
      const std::size_t alignment = dice % 10 == 3 ? std::size_t{1024} << (rng() % 12) : 0;
      try {
        void* p = alignment != 0 ? a.allocate_aligned(bytes, alignment, stream)
                                 : a.allocate(bytes, stream);
        if (alignment != 0) {
          ASSERT_EQ(addr(p) % alignment, 0u) << bytes << " B aligned to " << alignment;
          ++aligned;
        }
        // Under capture, one in ten is used on another stream from the start, so that its free
        // may come while that stream is captured.
        const StreamId user = (stream + 1) % streams;
        const bool early_use = capture && dice % 10 == 7 && user != captured;
        if (early_use) a.record_stream(p, user);
        ASSERT_TRUE(model.emplace(addr(p), Live{bytes, stream, early_use}).second)
            << "pointer handed out twice";
        order.push_back(addr(p));
        const auto info = a.find(p);
        ASSERT_TRUE(info.has_value());
        const std::string broken = guard.allocated(addr(p), info->size, stream);
        ASSERT_TRUE(broken.empty()) << broken << " (operation " << op << ", seed " << seed << ")";
        unmaps.allocated(addr(p), info->size);
      } catch (const OutOfMemoryError&) {
        ++ooms;  // allowed under a small capacity; the model is unchanged
      }
    } else {
      const std::size_t i = rng() % order.size();
      const DevicePtr p = order[i];
      order[i] = order.back();
      order.pop_back();
      const Live live = model.at(p);
      if (live.stream == captured) {  // deferred past the capture
        order.push_back(p);
        std::swap(order[i], order.back());
        continue;
      }
      const StreamId other = (stream + 1) % streams;
      const bool uses =
          (dice < 65 && other != live.stream && other != captured) || live.used_elsewhere;
      if (dice < 65 && other != captured) a.record_stream(reinterpret_cast<void*>(p), other);
      cross_frees += uses;
      const std::size_t size = a.find(reinterpret_cast<void*>(p))->size;
      guard.freed(p, size, live.stream, uses);
      unmaps.freed(p);
      a.deallocate(reinterpret_cast<void*>(p));
      model.erase(p);
    }
    if (dice % 7 == 0 || op % 50 == 0) a.process_events();
    if (sc.capacity <= kTightCapacity) turned |= a.stats().memory_first == 1;
    if (op % 997 == 0) a.release_cached();
    ASSERT_TRUE(unmaps.broken.empty())
        << unmaps.broken << " (operation " << op << ", seed " << seed << ")";
    if (op % check_every == 0 || op + 1 == ops) {
      check_against_model(a, sim, model);
      if (::testing::Test::HasFatalFailure()) {
        FAIL() << "at operation " << op << " (seed " << seed << ")";
      }
    }
  }
  if (captured != kNone) sim.end_capture(captured);
  if (capture) EXPECT_GT(captures, 0) << "no stream was captured";
  for (DevicePtr p : order) {
    unmaps.freed(p);
    a.deallocate(reinterpret_cast<void*>(p));
  }
  model.clear();
  check_against_model(a, sim, model);
  a.release_cached();
  EXPECT_TRUE(unmaps.broken.empty()) << unmaps.broken;
  EXPECT_EQ(sim.physical_bytes(), 0u) << "memory leaked after everything was freed";
  EXPECT_GT(cross_frees, 0u) << "no record_stream free was exercised";
  EXPECT_GT(aligned, 0u) << "no aligned allocation was exercised";
  if (std::string_view(sc.config).find("wait_before_grow:True") != std::string_view::npos) {
    EXPECT_GT(a.stats().grow_waits, 0) << "no wait before growing was exercised";
  }
  if (std::string_view(sc.config).find("internal_dependencies:True") != std::string_view::npos) {
    EXPECT_GT(a.stats().grow_stream_waits, 0) << "no device wait before growing was exercised";
  }
  if (sc.capacity <= kTightCapacity) {
    EXPECT_GT(ooms, 0u) << "a tight scenario never ran out of memory";
    // Running short, a mapping pool turns memory-first (config whole_chunk_fraction), and back
    // at a release_cached() that leaves it low: the checks above covered both, with blocks of
    // every state on several streams.
    if (!so.segments) {
      EXPECT_TRUE(turned) << "the pool never turned memory-first";
    }
  }
  ::testing::Test::RecordProperty("ooms", int(ooms));
  ::testing::Test::RecordProperty("operations", ops);
}

TEST_P(Randomized, InvariantsHoldAfterEveryOperation) {
  const auto& [sc, seed] = GetParam();
  // A tight scenario runs whole under sanitizers too: it must reach its capacity, which half
  // its operations may not (no_dormant_maps_tight seed 2 did not under ASan).
  const bool tight = sc.capacity <= kTightCapacity;
  run_scenario(sc, seed, tight ? sc.ops : sc.ops / kShortSanitizerScale, /*check_every=*/1,
               /*streams=*/4);
}

// The same with a stream under graph capture now and then: nothing the allocator does on its own
// (sweeps, device waits, plans' fences, pending frees) touches it.
TEST_P(Randomized, NothingTouchesAStreamUnderCapture) {
  const auto& [sc, seed] = GetParam();
  const bool tight = sc.capacity <= kTightCapacity;  // must reach its capacity, as above
  run_scenario(sc, seed, tight ? sc.ops : sc.ops / kShortSanitizerScale, /*check_every=*/10,
               /*streams=*/4, SIZE_MAX, /*capture=*/true);
}

const Scenario kScenarios[] = {
    {"roomy", 8 * GiB, 1, "", 3000},
    {"laggy_device", 8 * GiB, 200, "", 3000},
    {"tight", 384 * MiB, 20, "", 3000},
    {"no_slabs_fine_classes", 2 * GiB, 5, "small_limit:512,size_classes_per_doubling:8", 2000},
    {"threshold_half", 1 * GiB, 5, "defrag_threshold:0.5,sweep_interval:3", 2000},
    {"whole_chunks_tight", 512 * MiB, 10, "whole_chunk_min:4MiB", 3000},
    {"whole_chunks_roomy_one_dormant", 4 * GiB, 3, "whole_chunk_min:4MiB,dormant_maps:1", 3000},
    {"whole_chunks_no_dormant", 512 * MiB, 10, "whole_chunk_min:4MiB,dormant_maps:0", 2000},
    {"small_whole_chunks_tight", 384 * MiB, 10, "whole_chunk_min:4MiB,whole_chunk_max:8MiB", 3000},
    {"one_dormant_map_tight", 384 * MiB, 10, "dormant_maps:1", 3000},
    {"single_granules_tight", 384 * MiB, 20, "whole_chunk_min:0", 3000},
    {"single_granules_laggy", 8 * GiB, 200, "whole_chunk_min:0", 3000},
    {"no_dormant_maps_tight", 384 * MiB, 10, "dormant_maps:0", 2000},
    {"segments_roomy", 8 * GiB, 1, "upstream:malloc", 3000},
    {"segments_tight_laggy", 384 * MiB, 20, "upstream:async", 3000},
    {"own_first_laggy", 8 * GiB, 200, "placement:own_first", 3000},
    {"own_first_tight", 384 * MiB, 20, "placement:own_first", 3000},
    {"wait_before_grow_laggy", 8 * GiB, 200, "wait_before_grow:True", 3000},
    {"wait_before_grow_tight", 384 * MiB, 20, "wait_before_grow:True", 3000},
    {"wait_before_grow_memory_first_laggy", 8 * GiB, 200, "wait_before_grow:True,whole_chunk_min:0",
     3000},
    {"wait_before_grow_segments_laggy", 8 * GiB, 200, "wait_before_grow:True,upstream:malloc",
     3000},
    {"internal_dependencies_laggy", 8 * GiB, 200, "internal_dependencies:True", 3000},
    {"internal_dependencies_tight", 384 * MiB, 20, "internal_dependencies:True", 3000},
    {"internal_dependencies_memory_first_laggy", 8 * GiB, 200,
     "internal_dependencies:True,whole_chunk_min:0", 3000},
    {"internal_dependencies_segments_laggy", 8 * GiB, 200,
     "internal_dependencies:True,upstream:malloc", 3000},
};

INSTANTIATE_TEST_SUITE_P(Scenarios, Randomized,
                         ::testing::Combine(::testing::ValuesIn(kScenarios),
                                            ::testing::Values(1u, 2u, 3u)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_seed" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Long runs: six streams, about 200 blocks live, everything checked every kCheckEvery
// operations. Their operations add up to over a million (kLongOps).
constexpr int kCheckEvery = 1000;
constexpr Scenario kLongScenarios[] = {
    {"roomy", 8 * GiB, 1, "", 170'000 / kSanitizerScale},
    {"laggy_device", 8 * GiB, 64, "", 170'000 / kSanitizerScale},
    {"tight", 448 * MiB, 8, "", 170'000 / kSanitizerScale},
    {"single_granules_laggy", 4 * GiB, 32, "whole_chunk_min:0,sweep_interval:4",
     170'000 / kSanitizerScale},
    {"small_whole_chunks_tight", 512 * MiB, 4, "whole_chunk_max:8MiB,dormant_maps:1",
     170'000 / kSanitizerScale},
    {"segments_tight", 512 * MiB, 8, "upstream:malloc", 170'000 / kSanitizerScale},
    {"own_first_laggy", 8 * GiB, 64, "placement:own_first", 170'000 / kSanitizerScale},
};
constexpr int long_ops() {
  int n = 0;
  for (const Scenario& s : kLongScenarios) n += s.ops;
  return n;
}
static_assert(kSanitizerScale != 1 || long_ops() >= 1'000'000,
              "the long runs must reach a million operations per CI run");

class RandomizedLong : public ::testing::TestWithParam<Scenario> {};

TEST_P(RandomizedLong, InvariantsHoldOverLongRuns) {
  run_scenario(GetParam(), 7, GetParam().ops, kCheckEvery, /*streams=*/6, /*max_live=*/200);
}

INSTANTIATE_TEST_SUITE_P(Scenarios, RandomizedLong, ::testing::ValuesIn(kLongScenarios),
                         [](const auto& info) { return std::string(info.param.name); });

// A training loop: the same sequence of (stream, size) allocations and frees, iteration after
// iteration, over blocks allocated once and never freed (weights). Sizes, streams and the order
// of frees are drawn once; a fifth of the frees come after record_stream on another stream.
struct LoopStep {
  bool allocate;
  std::size_t slot;  // which block of the iteration
  std::size_t bytes;
  StreamId stream;
  StreamId use;  // record_stream before the free; == stream for none
};

std::vector<LoopStep> loop_script(std::mt19937_64& rng, std::size_t blocks, unsigned streams,
                                  SizeFn size) {
  std::vector<LoopStep> steps;
  std::vector<std::size_t> live;
  std::size_t next = 0;
  while (next < blocks || !live.empty()) {
    if (next < blocks && (live.empty() || rng() % 100 < 55)) {
      const StreamId s = rng() % streams;
      const StreamId use = rng() % 5 == 0 ? (s + 1) % streams : s;
      steps.push_back({true, next, size(rng), s, use});
      live.push_back(next++);
    } else {
      const std::size_t k = rng() % live.size();
      steps.push_back({false, live[k], 0, 0, 0});
      live[k] = live.back();
      live.pop_back();
    }
  }
  return steps;
}

struct LoopResult {
  std::vector<std::int64_t> peak_reserved;  // per iteration
  std::vector<std::int64_t> driver_calls;   // per iteration: map, unmap, access, create, release
  std::int64_t planned = 0;                 // allocations served at their loop-planned offset
  std::int64_t stream_waits = 0;            // planned streams made to wait for another's free
  std::int64_t retries = 0;                 // times memory ran short (num_alloc_retries)
};

std::int64_t driver_calls(const Stats& s) {
  return s.map_calls + s.unmap_calls + s.access_calls + s.num_device_alloc + s.num_device_free;
}

// Runs `iterations` of one script; checks everything after every operation. Returns each
// iteration's highest reserved bytes. A refused allocation fails the test unless `tight`, where
// that block is left out of the iteration (its free too).
// `capture`: from iteration 5 on, one stream other than the weights' is captured over a random
// stretch of each iteration and treated as PyTorch's adapter treats it (as run_scenario's
// `capture`): its requests skipped, its blocks' frees deferred past the capture, no
// record_stream for it.
LoopResult run_loop(const Scenario& sc, unsigned seed, int iterations, std::size_t blocks,
                    bool tight = false, SizeFn size = random_size, bool capture = false) {
  constexpr unsigned kStreams = 4;
  std::mt19937_64 rng(seed);
  const Config config = Config::parse(sc.config);
  SimBackend::Options so = sim_options(sc.capacity, sc.latency);
  so.segments = config.upstream != Upstream::kVmm;
  SimBackend sim(so);
  UnmapGuard unmaps(sim, sc.latency);
  Allocator a(unmaps, config);
  ReuseGuard guard(sim, sc.latency);
  std::map<DevicePtr, Live> model;
  std::vector<void*> weights;
  for (int w = 0; w < 8; ++w) {
    const std::size_t bytes = size(rng);
    weights.push_back(a.allocate(bytes, 0));
    model.emplace(addr(weights.back()), Live{bytes, 0});
    unmaps.allocated(addr(weights.back()), a.find(weights.back())->size);
  }
  const std::vector<LoopStep> script = loop_script(rng, blocks, kStreams, size);
  std::vector<void*> slot(blocks, nullptr);
  std::vector<StreamId> use_of(blocks);
  for (const LoopStep& step : script) {
    if (step.allocate) use_of[step.slot] = step.use;
  }
  LoopResult out;
  auto free_block = [&](void* p, std::size_t slot_index) {
    const Live live = model.at(addr(p));
    const StreamId use = use_of[slot_index];
    const bool used = use != live.stream && !sim.stream_capturing(use);
    if (used) a.record_stream(p, use);
    guard.freed(addr(p), a.find(p)->size, live.stream, used);
    unmaps.freed(addr(p));
    a.deallocate(p);
    model.erase(addr(p));
  };
  constexpr StreamId kNone = ~StreamId{0};
  std::vector<std::pair<void*, std::size_t>> deferred;  // frees of the captured stream's blocks
  for (int it = 0; it < iterations; ++it) {
    std::int64_t peak = 0;
    const std::int64_t calls_before = driver_calls(a.stats());
    StreamId captured = kNone;
    std::size_t from = 0, to = 0, at = 0;
    if (capture && it >= 5) {
      captured = 1 + rng() % (kStreams - 1);
      from = rng() % script.size();
      to = from + rng() % (script.size() - from + 1);
    }
    auto end_capture = [&] {
      sim.end_capture(captured);
      for (const auto& [p, i] : deferred) free_block(p, i);
      deferred.clear();
    };
    for (const LoopStep& step : script) {
      sim.advance(1);
      if (captured != kNone && at == from) sim.begin_capture(captured);
      if (captured != kNone && at == to && sim.stream_capturing(captured)) end_capture();
      ++at;
      if (step.allocate && sim.stream_capturing(step.stream)) {  // a private pool's
        slot[step.slot] = nullptr;
        continue;
      }
      if (!step.allocate && slot[step.slot] != nullptr &&
          sim.stream_capturing(model.at(addr(slot[step.slot])).stream)) {
        deferred.emplace_back(slot[step.slot], step.slot);
        continue;
      }
      if (step.allocate) {
        void* p = nullptr;
        try {
          p = a.allocate(step.bytes, step.stream);
        } catch (const OutOfMemoryError&) {
          if (!tight) throw;
          slot[step.slot] = nullptr;
          check_against_model(a, sim, model);
          continue;
        }
        slot[step.slot] = p;
        model.emplace(addr(p), Live{step.bytes, step.stream});
        unmaps.allocated(addr(p), a.find(p)->size);
        const std::string broken = guard.allocated(addr(p), a.find(p)->size, step.stream);
        EXPECT_TRUE(broken.empty()) << broken;
      } else {
        void* p = slot[step.slot];
        if (p == nullptr) continue;  // refused (tight), or a captured stream's request
        free_block(p, step.slot);
      }
      check_against_model(a, sim, model);
      EXPECT_TRUE(unmaps.broken.empty()) << unmaps.broken;
      if (!unmaps.broken.empty()) return out;
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "iteration " << it << " (seed " << seed << ")";
        return out;
      }
      peak = std::max(peak, reserved(a));
    }
    if (captured != kNone && sim.stream_capturing(captured)) end_capture();
    a.process_events();  // once per step, as the PyTorch drop-in does
    out.peak_reserved.push_back(peak);
    out.driver_calls.push_back(driver_calls(a.stats()) - calls_before);
  }
  out.planned = a.stats().planned_allocations;
  out.stream_waits = a.stats().stream_waits;
  out.retries = a.stats().num_alloc_retries;
  for (void* w : weights) {
    unmaps.freed(addr(w));
    a.deallocate(w);
  }
  a.release_cached();
  EXPECT_TRUE(unmaps.broken.empty()) << unmaps.broken;
  EXPECT_EQ(sim.physical_bytes(), 0u) << "memory leaked after everything was freed";
  return out;
}

const Scenario kLoopScenarios[] = {
    {"default", 16 * GiB, 1, "", 0},
    {"default_laggy", 16 * GiB, 16, "", 0},
    {"memory_first", 16 * GiB, 4, "whole_chunk_min:0", 0},
    {"segments", 16 * GiB, 4, "upstream:malloc", 0},
    {"loop_plan", 16 * GiB, 1, "loop_plan:True", 0},
    {"loop_plan_laggy", 16 * GiB, 16, "loop_plan:True", 0},
    {"loop_plan_memory_first", 16 * GiB, 4, "loop_plan:True,whole_chunk_min:0", 0},
    {"own_first_laggy", 16 * GiB, 16, "placement:own_first", 0},
};
constexpr int kLoopIterations = 12;
constexpr std::size_t kLoopBlocks = 150;

class RandomizedLoop : public ::testing::TestWithParam<std::tuple<Scenario, unsigned>> {};

TEST_P(RandomizedLoop, IdenticalIterationsKeepInvariants) {
  const auto& [sc, seed] = GetParam();
  const LoopResult r = run_loop(sc, seed, kLoopIterations, kLoopBlocks);
  ASSERT_EQ(r.peak_reserved.size(), std::size_t(kLoopIterations));
}

// The same loops with a stream under graph capture over part of each iteration from the sixth
// on: no plan fence, device wait or host wait touches it (the simulator throws if one does).
// Eight seeds: a pending free of a planned block coming due inside a capture took several.
class RandomizedLoopCapture : public RandomizedLoop {};
TEST_P(RandomizedLoopCapture, PlansLeaveAStreamUnderCaptureAlone) {
  const auto& [sc, seed] = GetParam();
  const LoopResult r =
      run_loop(sc, seed, kLoopIterations, kLoopBlocks, false, random_size, /*capture=*/true);
  ASSERT_EQ(r.peak_reserved.size(), std::size_t(kLoopIterations));
}

auto loop_name = [](const auto& info) {
  return std::string(std::get<0>(info.param).name) + "_seed" +
         std::to_string(std::get<1>(info.param));
};

INSTANTIATE_TEST_SUITE_P(Scenarios, RandomizedLoop,
                         ::testing::Combine(::testing::ValuesIn(kLoopScenarios),
                                            ::testing::Values(1u, 2u)),
                         loop_name);

INSTANTIATE_TEST_SUITE_P(Scenarios, RandomizedLoopCapture,
                         ::testing::Combine(::testing::ValuesIn(kLoopScenarios),
                                            ::testing::Range(1u, 9u)),
                         loop_name);

// A loop that repeats exactly must stop growing: no iteration after the fourth reserves more
// than the fourth did.
class RandomizedLoopConverges : public RandomizedLoop {};

TEST_P(RandomizedLoopConverges, ReservedStopsGrowingAfterIteration3) {
  const auto& [sc, seed] = GetParam();
  const LoopResult r = run_loop(sc, seed, kLoopIterations, kLoopBlocks);
  ASSERT_EQ(r.peak_reserved.size(), std::size_t(kLoopIterations));
  for (int it = 4; it < kLoopIterations; ++it) {
    EXPECT_LE(r.peak_reserved[it], r.peak_reserved[3])
        << "iteration " << it << " reserved " << r.peak_reserved[it] - r.peak_reserved[3]
        << " bytes more than iteration 3";
  }
}

INSTANTIATE_TEST_SUITE_P(Segments, RandomizedLoopConverges,
                         ::testing::Combine(::testing::Values(kLoopScenarios[3]),
                                            ::testing::Values(1u, 2u)),
                         loop_name);

// The default (memory first under a loop plan) and memory first converge by iteration 3 in
// mapping mode too, the laggy loop included (its plan packs the streams' blocks with no margin,
// ordered by stream waits; with the 256-event margin it reserved 6 MiB more from iteration 4).
// Segment mode (above) does not grow on seeds 1 and 2, but does on other seeds: those two are a
// regression check, not a proof that segment mode converges.
INSTANTIATE_TEST_SUITE_P(Mapping, RandomizedLoopConverges,
                         ::testing::Combine(::testing::Values(kLoopScenarios[0], kLoopScenarios[1],
                                                              kLoopScenarios[2]),
                                            ::testing::Values(1u, 2u)),
                         loop_name);

// With loop_plan, a loop that repeats exactly is planned once it has repeated twice, tried for a
// period, put in use at its quietest point and trimmed a period later: from then on no
// iteration calls the driver, and reserved memory stops moving. (The ReuseGuard in run_loop
// checks every planned reuse across streams against the events.)
class RandomizedLoopPlan : public RandomizedLoop {};

TEST_P(RandomizedLoopPlan, NoDriverCallsOnceThePlanIsInUse) {
  const auto& [sc, seed] = GetParam();
  const LoopResult r = run_loop(sc, seed, kLoopIterations, kLoopBlocks);
  ASSERT_EQ(r.driver_calls.size(), std::size_t(kLoopIterations));
  EXPECT_GT(r.planned, std::int64_t(kLoopBlocks)) << "the loop was never planned";
  constexpr int kWarmUp = 6;
  for (int it = kWarmUp; it < kLoopIterations; ++it) {
    EXPECT_EQ(r.driver_calls[it], 0) << "iteration " << it;
    EXPECT_EQ(r.peak_reserved[it], r.peak_reserved[kWarmUp]) << "iteration " << it;
  }
  // The plan's range takes over the pool's memory as the old blocks die, so putting it in use
  // costs no peak: no iteration holds more than the pool alone (iterations 0-2) or the plan in
  // steady state (the last iteration) does.
  const std::int64_t bound =
      std::max(*std::max_element(r.peak_reserved.begin(), r.peak_reserved.begin() + 3),
               r.peak_reserved.back());
  for (int it = 3; it < kLoopIterations; ++it)
    EXPECT_LE(r.peak_reserved[it], bound) << "iteration " << it;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, RandomizedLoopPlan,
                         ::testing::Combine(::testing::Values(kLoopScenarios[4], kLoopScenarios[5],
                                                              kLoopScenarios[6]),
                                            ::testing::Values(1u, 2u, 3u)),
                         loop_name);

// With stream waits (the default) a plan packs blocks of different streams with no margin
// between them: where the device has not reached a free on one stream, the next block on
// another stream is ordered after it on the device instead (the ReuseGuard accepts that order
// and no other). Never more memory than planning the streams apart, and the waits happen.
TEST(RandomizedLoopPlanStreamWaits, PackTighterThanAMarginAndStayOrdered) {
  std::int64_t waits = 0;
  for (unsigned seed : {1u, 2u, 3u}) {
    const Scenario waiting{"waits", 16 * GiB, 16, "loop_plan:True", 0};
    const Scenario apart{"apart", 16 * GiB, 16, "loop_plan:True,plan_stream_waits:False", 0};
    const LoopResult w = run_loop(waiting, seed, kLoopIterations, kLoopBlocks);
    const LoopResult m = run_loop(apart, seed, kLoopIterations, kLoopBlocks);
    ASSERT_EQ(w.peak_reserved.size(), std::size_t(kLoopIterations));
    ASSERT_EQ(m.peak_reserved.size(), std::size_t(kLoopIterations));
    EXPECT_LE(w.peak_reserved.back(), m.peak_reserved.back()) << "seed " << seed;
    EXPECT_EQ(m.stream_waits, 0) << "seed " << seed;
    waits += w.stream_waits;
  }
  EXPECT_GT(waits, 0) << "no planned block was ordered after another stream's free";
}

// A loop under a limit a little below what it held when roomy (above its plan's extent): plans
// are put in use, parts of their lazy range are refused memory (the pool serves those
// requests), memory running short retires the plan and cuts its range around live blocks, and
// the pieces go back to the pool with holes. Everything is checked after every operation.
TEST(RandomizedLoopPlanTight, InvariantsHoldWhenMemoryRunsShort) {
  for (const char* config : {"loop_plan:True", "loop_plan:True,whole_chunk_min:0",
                             "loop_plan:True,whole_chunk_min:0,dormant_maps:0"}) {
    for (unsigned seed : {1u, 2u}) {
      const Scenario roomy{"roomy", 16 * GiB, 4, config, 0};
      const LoopResult free_run = run_loop(roomy, seed, 4, kLoopBlocks);
      const std::int64_t held =
          *std::max_element(free_run.peak_reserved.begin(), free_run.peak_reserved.end());
      const Scenario tight{"tight", round_up(std::size_t(held) * 96 / 100, kGranule), 4, config, 0};
      const LoopResult r = run_loop(tight, seed, kLoopIterations, kLoopBlocks, /*tight=*/true);
      if (::testing::Test::HasFailure()) return;
      EXPECT_GT(r.retries, 0) << config << " seed " << seed << ": memory never ran short";
      EXPECT_GT(r.planned, 0) << config << " seed " << seed << ": nothing was planned";
    }
  }
}

// Sizes near whole granules, memory short, the device far behind: granules are aliased whole
// and their blocks freed again at the new address, so some are mapped only at a retired one.
// The breakdown's parts must still add up to the physical bytes (check_against_model).
TEST(RandomizedLoopPlanTight, BreakdownAddsUpWhenGranulesAreMappedOnlyWhereRetired) {
  std::int64_t retries = 0;
  for (unsigned seed : {6u, 21u, 25u, 37u}) {
    const Scenario tight{"tight_granular", 500 * MiB, 100, "loop_plan:True,whole_chunk_min:4MiB",
                         0};
    const LoopResult r = run_loop(tight, seed, 10, 80, /*tight=*/true, granular_size);
    if (::testing::Test::HasFailure()) return;
    retries += r.retries;
  }
  EXPECT_GT(retries, 0) << "memory never ran short";
}

// An iteration far longer than the plan's cross-stream margin (so the plan shares bytes across
// streams) with events slower than that margin: the fences recorded at those frees must hold
// each reuse back until its event completes (the ReuseGuard fails the test otherwise).
TEST(RandomizedLoopPlanFences, SlowEventsHoldBackCrossStreamReuse) {
  const Scenario slow{"loop_plan_slow_events", 64 * GiB, 4000, "loop_plan:True", 0};
  const LoopResult r = run_loop(slow, 7, 6, 400);
  EXPECT_GT(r.planned, 400) << "the loop was never planned";
}

TEST(RandomizedThreads, ConcurrentStreamsKeepTheAllocatorConsistent) {
  SimBackend sim(sim_options(16 * GiB, 2));
  Allocator a(sim);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<void*> mine;
      for (int i = 0; i < 3000; ++i) {
        if (mine.empty() || rng() % 2) {
          mine.push_back(a.allocate(random_size(rng), StreamId(t + 1)));
        } else {
          const std::size_t k = rng() % mine.size();
          a.deallocate(mine[k]);
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (void* p : mine) a.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  a.check_invariants();
  EXPECT_EQ(a.stats().allocation[0].current, 0);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

// Threads each repeating the same short loop on their own stream (a loop per thread, so the
// sequence the allocator sees repeats only as the threads happen to interleave): the planner
// must neither plan a loop no thread makes nor corrupt what it serves.
TEST(RandomizedThreads, EachThreadLoopingOnItsOwnStream) {
  SimBackend sim(sim_options(16 * GiB, 2));
  Allocator a(sim);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&a, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = a.allocate(std::size_t{1} << (10 + i % 14), StreamId(t + 1));
        a.deallocate(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  a.check_invariants();
  EXPECT_EQ(a.stats().allocation[0].current, 0);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

}  // namespace
