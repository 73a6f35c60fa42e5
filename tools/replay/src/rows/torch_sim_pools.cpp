// The CUDA graphs' private pools of a recording (infer_graph_pools, torch_sim.hpp): which
// allocations came from a graph pool, read from what the recording's releases left standing.
#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "cuarena/replay/torch_sim.hpp"

namespace cuarena::replay {

namespace {

constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();
constexpr std::uint32_t kNoSegment = std::numeric_limits<std::uint32_t>::max();

// One cudaMalloc segment of the recording.
struct RecordedSegment {
  std::uint64_t stream = 0, end = 0;
  std::size_t created = 0;        // its segment_alloc event
  std::size_t released = kNever;  // the first event of the release that freed it
  std::uint32_t live = 0;         // blocks allocated in it and not yet free_completed
  bool kept_whole_free = false;   // a release left it standing with nothing allocated
  TorchGraphPools::PoolId pool = TorchCachingSim::kDefaultPool;
};

bool is_release(Action a) {
  return a == Action::kSegmentFree || a == Action::kSegmentUnmap || a == Action::kOom;
}

// The recording, segment by segment: where each allocation lay and what every release (a run of
// release events up to the next alloc or free_completed, as the replay groups them) kept.
struct Recording {
  std::vector<RecordedSegment> segments;
  std::vector<std::uint32_t> alloc_segment;  // per event

  explicit Recording(const std::vector<Event>& events) : alloc_segment(events.size(), kNoSegment) {
    std::map<std::uint64_t, std::uint32_t> by_base;           // live segments
    std::unordered_map<std::uint64_t, std::uint32_t> blocks;  // live block address -> segment
    bool in_release = false;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const Event& e = events[i];
      switch (e.action) {
        case Action::kSegmentAlloc:
          by_base[e.addr] = std::uint32_t(segments.size());
          segments.push_back({e.stream, e.addr + e.size, i});
          break;
        case Action::kAlloc: {
          in_release = false;
          auto it = by_base.upper_bound(e.addr);
          if (it == by_base.begin() || e.addr >= segments[std::prev(it)->second].end) break;
          const std::uint32_t s = std::prev(it)->second;
          alloc_segment[i] = s;
          ++segments[s].live;
          blocks[e.addr] = s;
          break;
        }
        case Action::kFreeCompleted: {
          in_release = false;
          auto it = blocks.find(e.addr);
          if (it == blocks.end()) break;
          --segments[it->second].live;
          blocks.erase(it);
          break;
        }
        default:
          break;
      }
      if (is_release(e.action) && !in_release) {
        in_release = true;
        release(events, i, by_base);
      }
      if (e.action == Action::kSegmentFree) by_base.erase(e.addr);
    }
  }

  // A release starting at event `first`: mark what it freed, and the whole free segments it kept
  // on streams where it freed nothing. A partial release (of oversize or aged blocks) frees some
  // of a stream's segments and keeps others, and one that freed nothing may not have run (malloc
  // skips it while a capture is under way): no sign of a pool in either.
  void release(const std::vector<Event>& events, std::size_t first,
               const std::map<std::uint64_t, std::uint32_t>& by_base) {
    std::unordered_set<std::uint64_t> streams_released;
    for (std::size_t j = first; j < events.size() && events[j].action != Action::kAlloc &&
                                events[j].action != Action::kFreeCompleted;
         ++j) {
      if (events[j].action != Action::kSegmentFree) continue;
      auto it = by_base.find(events[j].addr);
      if (it == by_base.end()) continue;
      RecordedSegment& s = segments[it->second];
      s.released = first;
      streams_released.insert(s.stream);
    }
    if (streams_released.empty()) return;
    for (const auto& [base, id] : by_base) {
      RecordedSegment& s = segments[id];
      if (s.live == 0 && s.released == kNever && !streams_released.count(s.stream))
        s.kept_whole_free = true;
    }
  }
};

}  // namespace

TorchGraphPools infer_graph_pools(const std::vector<Event>& events) {
  TorchGraphPools pools;
  // Only native recordings are read, and only a release can show a pool.
  const auto has = [&](Action a) {
    return std::any_of(events.begin(), events.end(), [&](const Event& e) { return e.action == a; });
  };
  if (has(Action::kSegmentMap) || !has(Action::kSegmentFree)) return pools;
  Recording rec(events);

  // Per stream, in the order they were made: from a kept segment on, the stream's segments are
  // one private pool's, until the first of them is released (releasePool was called; a later
  // kept segment starts another pool).
  std::map<std::uint64_t, std::vector<std::uint32_t>> by_stream;
  for (std::uint32_t id = 0; id < rec.segments.size(); ++id)
    by_stream[rec.segments[id].stream].push_back(id);
  for (const auto& [stream, ids] : by_stream) {
    TorchGraphPools::PoolId pool = TorchCachingSim::kDefaultPool;
    std::size_t pool_released = kNever;  // the release of the current pool, once seen
    for (std::uint32_t id : ids) {
      RecordedSegment& s = rec.segments[id];
      if (pool != TorchCachingSim::kDefaultPool && s.created > pool_released) {
        pools.released.emplace_back(pool_released, pool);
        pool = TorchCachingSim::kDefaultPool;
        pool_released = kNever;
      }
      if (pool == TorchCachingSim::kDefaultPool && s.kept_whole_free) pool = ++pools.pools;
      if (pool == TorchCachingSim::kDefaultPool) continue;
      s.pool = pool;
      pool_released = std::min(pool_released, s.released);
    }
    if (pool != TorchCachingSim::kDefaultPool && pool_released != kNever)
      pools.released.emplace_back(pool_released, pool);
  }
  if (pools.pools == 0) return pools;
  std::sort(pools.released.begin(), pools.released.end());
  pools.alloc_pool.assign(events.size(), TorchCachingSim::kDefaultPool);
  for (std::size_t i = 0; i < events.size(); ++i)
    if (rec.alloc_segment[i] != kNoSegment)
      pools.alloc_pool[i] = rec.segments[rec.alloc_segment[i]].pool;
  return pools;
}

}  // namespace cuarena::replay
