// Allocator::set_reservation_observer: what the PyTorch adapter turns into a snapshot's segment
// map / unmap events. Their running sum must be reserved memory at every moment, and each
// release must name an address that was reported created and not yet released.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

namespace {

class ReservationObserver : public ::testing::TestWithParam<Mode> {};

TEST_P(ReservationObserver, EventsSumToReservedAndPairByAddress) {
  SimBackend sim(mode_options(GetParam(), 2 * GiB, /*latency=*/8));
  Config config = Config::parse(GetParam().config);
  // A limit close to the workload, so chunks are released and memory moves.
  config.per_process_memory_fraction = 0.5;
  Allocator a(sim, config);
  std::int64_t sum = 0;
  std::map<DevicePtr, std::int64_t> held;  // address -> bytes reported there and not released
  std::size_t creates = 0, releases = 0;
  a.set_reservation_observer([&](const Allocator::ReservationChange& c) {
    ASSERT_NE(c.bytes, 0);
    ASSERT_NE(c.address, 0u);
    sum += c.bytes;
    if (c.bytes > 0) {
      ++creates;
      held[c.address] += c.bytes;
    } else {
      ++releases;
      auto it = held.find(c.address);
      ASSERT_NE(it, held.end()) << "released at an address never reported";
      ASSERT_GE(it->second, -c.bytes);
      if ((it->second += c.bytes) == 0) held.erase(it);
    }
  });
  std::mt19937_64 rng(7);
  std::vector<void*> live;
  for (int i = 0; i < 4000; ++i) {
    const auto r = rng() % 100;
    if (r < 55 && live.size() < 48) {
      const std::size_t bytes = rng() % 4 ? 1 + rng() % (2 * MiB) : 1 + rng() % (96 * MiB);
      try {
        live.push_back(a.allocate(bytes, 1 + rng() % 2));
      } catch (const OutOfMemoryError&) {
      }
    } else if (r < 98 && !live.empty()) {
      const std::size_t k = rng() % live.size();
      a.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      a.release_cached();
    }
    ASSERT_EQ(sum, reserved(a)) << "after operation " << i;
  }
  for (void* p : live) a.deallocate(p);
  a.release_cached();
  EXPECT_EQ(sum, reserved(a));
  EXPECT_EQ(sum, 0);
  EXPECT_TRUE(held.empty());
  EXPECT_GT(creates, 10u);
  EXPECT_GT(releases, 10u);
  // Dropped: no more calls (the observer's captures may be gone).
  a.set_reservation_observer(nullptr);
  void* p = a.allocate(64 * MiB, 1);
  a.deallocate(p);
  a.release_cached();
  EXPECT_EQ(sum, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, ReservationObserver, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
