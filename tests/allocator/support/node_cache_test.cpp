// NodeCache / CachedAllocator (allocator/src/node_cache.hpp): the recycled nodes behind the
// pool's size and address indexes.
#include "support/node_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace cuarena::detail {
namespace {

TEST(NodeCache, AGivenNodeIsTakenBackAndOtherSizesAreNotCached) {
  NodeCache cache;
  void* a = cache.take(48);
  void* b = cache.take(48);
  cache.give(a, 48);
  EXPECT_EQ(cache.take(48), a) << "the node given back is the next taken";
  cache.give(b, 48);
  void* other = cache.take(64);  // not the cache's size: straight from operator new
  EXPECT_NE(other, b);
  cache.give(other, 64);
  EXPECT_EQ(cache.take(48), b) << "a node of another size joined the free list";
  cache.give(a, 48);
  cache.give(b, 48);
}

// A set and a map over one cache each, driven at random against plain ones: same contents.
TEST(NodeCache, IndexesOverTheCacheKeepTheirContents) {
  NodeCache set_nodes, map_nodes;
  std::set<int, std::less<>, CachedAllocator<int>> cached{CachedAllocator<int>(&set_nodes)};
  std::map<long, int, std::less<>, CachedAllocator<std::pair<const long, int>>> cached_map{
      CachedAllocator<std::pair<const long, int>>(&map_nodes)};
  std::set<int> plain;
  std::map<long, int> plain_map;
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const int k = int(rng() % 500);
    if (rng() % 2) {
      cached.insert(k);
      plain.insert(k);
      cached_map.try_emplace(k, i);
      plain_map.try_emplace(k, i);
    } else {
      cached.erase(k);
      plain.erase(k);
      cached_map.erase(k);
      plain_map.erase(k);
    }
  }
  EXPECT_TRUE(std::equal(cached.begin(), cached.end(), plain.begin(), plain.end()));
  EXPECT_TRUE(std::equal(cached_map.begin(), cached_map.end(), plain_map.begin(), plain_map.end()));
}

}  // namespace
}  // namespace cuarena::detail
