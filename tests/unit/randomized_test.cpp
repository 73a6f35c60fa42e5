// Randomized invariant tests: thousands of operations over several streams, every invariant
// checked as we go against a simple model of what should be live.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

struct Live {
  std::size_t requested;
  StreamId stream;
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
    std::vector<std::pair<std::pair<PhysHandle, std::size_t>, std::pair<std::size_t, DevicePtr>>> pieces;
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
  if (sim.supports_mapping()) {  // where each reserved byte is: the parts add up to the whole
    const auto m = a.memory_breakdown();
    ASSERT_EQ(m.in_use + m.owned_cached + m.shared_cached + m.idle, sim.physical_bytes());
  }
  ASSERT_LE(sim.physical_bytes(), sim.capacity());
}

TEST_P(Randomized, InvariantsHoldAfterEveryOperation) {
  const auto& [sc, seed] = GetParam();
  std::mt19937_64 rng(seed);
  const Config config = Config::parse(sc.config);
  SimBackend::Options so = sim_options(sc.capacity, sc.latency);
  so.segments = config.upstream != Upstream::kVmm;  // the segment upstreams' core path
  SimBackend sim(so);
  Allocator a(sim, config);
  std::map<DevicePtr, Live> model;
  std::vector<DevicePtr> order;
  std::size_t ooms = 0;
  for (int op = 0; op < sc.ops; ++op) {
    sim.advance(1);
    const int dice = int(rng() % 100);
    const StreamId stream = rng() % 4;
    if (dice < 55 || model.empty()) {
      const std::size_t bytes = random_size(rng);
      try {
        void* p = a.allocate(bytes, stream);
        ASSERT_TRUE(model.emplace(addr(p), Live{bytes, stream}).second) << "pointer handed out twice";
        order.push_back(addr(p));
      } catch (const OutOfMemoryError&) {
        ++ooms;  // allowed under a small capacity; the model is unchanged
      }
    } else {
      const std::size_t i = rng() % order.size();
      const DevicePtr p = order[i];
      order[i] = order.back();
      order.pop_back();
      if (dice < 65) a.record_stream(reinterpret_cast<void*>(p), (stream + 1) % 4);
      a.deallocate(reinterpret_cast<void*>(p));
      model.erase(p);
    }
    if (dice % 7 == 0 || op % 50 == 0) a.process_events();
    if (op % 997 == 0) a.release_cached();
    check_against_model(a, sim, model);
    if (HasFatalFailure()) FAIL() << "at operation " << op << " (seed " << seed << ")";
  }
  for (DevicePtr p : order) a.deallocate(reinterpret_cast<void*>(p));
  model.clear();
  check_against_model(a, sim, model);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u) << "memory leaked after everything was freed";
  RecordProperty("ooms", int(ooms));
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
};

INSTANTIATE_TEST_SUITE_P(
    Scenarios, Randomized,
    ::testing::Combine(::testing::ValuesIn(kScenarios), ::testing::Values(1u, 2u, 3u)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + "_seed" +
             std::to_string(std::get<1>(info.param));
    });

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

}  // namespace
