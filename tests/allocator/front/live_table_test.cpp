// LiveTable (allocator/src/live_table.hpp): the open-addressing stripes against std::map, through
// growth, erasure and reuse of erased slots, with keys shaped like device pointers (512-byte and
// 2 MiB aligned, which a poor hash would pile into one probe run).
#include "front/live_table.hpp"  // private to the core: tests/CMakeLists.txt adds allocator/src

#include <gtest/gtest.h>

#include <map>
#include <random>

using cuarena::DevicePtr;
using cuarena::detail::LiveBlock;
using cuarena::detail::LiveTable;

namespace {
cuarena::StreamId StreamIdFor(int i) { return cuarena::StreamId(i % 5 + 1); }
}  // namespace

TEST(LiveTable, AgreesWithAMapThroughGrowthAndErasure) {
  LiveTable table;
  std::map<DevicePtr, std::size_t> model;  // key -> requested
  std::mt19937_64 rng(11);
  auto random_key = [&] {
    const DevicePtr base = DevicePtr{1} << 40;
    return rng() % 2 ? base + (rng() % 4096) * (DevicePtr{2} << 20)  // granule aligned
                     : base + (rng() % 200000) * 512;                // block aligned
  };
  for (int i = 0; i < 200000; ++i) {
    const DevicePtr key = random_key();
    if (model.count(key) == 0 && rng() % 3 != 0) {
      LiveBlock rec;
      rec.requested = std::size_t(i) + 1;
      rec.uses = {StreamIdFor(i)};
      table.insert(key, std::move(rec));
      model[key] = std::size_t(i) + 1;
    } else {
      const auto taken = table.take(key);
      ASSERT_EQ(taken.has_value(), model.count(key) == 1) << "key " << key;
      if (taken) {
        EXPECT_EQ(taken->requested, model[key]);
        ASSERT_EQ(taken->uses.size(), 1u);
        EXPECT_EQ(taken->uses[0], StreamIdFor(int(model[key]) - 1));
        model.erase(key);
      }
      EXPECT_FALSE(table.contains(key));
    }
  }
  EXPECT_EQ(table.size(), model.size());
  std::size_t seen = 0;
  table.for_each([&](DevicePtr key, const LiveBlock& rec) {
    ++seen;
    ASSERT_EQ(model.count(key), 1u);
    EXPECT_EQ(rec.requested, model[key]);
  });
  EXPECT_EQ(seen, model.size());
  for (const auto& [key, requested] : model) {
    EXPECT_TRUE(table.update(key, [&](LiveBlock& rec) { rec.uses.push_back(7); }));
    EXPECT_EQ(table.take(key)->uses.size(), 2u);
  }
  EXPECT_EQ(table.size(), 0u);
  EXPECT_FALSE(table.update(DevicePtr{1} << 40, [](LiveBlock&) {}));
}

// 0 and 1 mark empty and erased slots inside a stripe: they must never be found as keys, even
// when a stripe has empty and erased slots in their probe runs.
TEST(LiveTable, TheSlotMarkersAreNeverKeys) {
  LiveTable table;
  std::vector<DevicePtr> keys;
  for (DevicePtr k = DevicePtr{1} << 40; keys.size() < 4096; k += 512) keys.push_back(k);
  for (DevicePtr k : keys) table.insert(k, LiveBlock{});
  for (std::size_t i = 0; i < keys.size(); i += 2) ASSERT_TRUE(table.take(keys[i]));  // erased
  for (DevicePtr marker : {DevicePtr{0}, DevicePtr{1}}) {
    EXPECT_FALSE(table.contains(marker));
    EXPECT_FALSE(table.take(marker).has_value());
    EXPECT_FALSE(table.update(marker, [](LiveBlock&) {}));
  }
  EXPECT_EQ(table.size(), keys.size() / 2);
}
