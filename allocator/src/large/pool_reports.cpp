// What the block pool holds, for statistics and snapshots: mapped runs, free mapped extents and
// where the physical memory is. Read-only walks over the arenas' blocks and granules.
#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "large/block_pool.hpp"

namespace cuarena::detail {

void BlockPool::mapped_runs(std::vector<std::pair<DevicePtr, std::size_t>>& out) const {
  for (const auto& arena : arenas_) {
    const Arena& a = *arena;
    std::size_t first = 0;
    bool open = false;
    for (std::size_t g = 0; g <= a.high_water(); ++g) {
      const bool mapped = g < a.high_water() && a.is_mapped(g);
      if (mapped && !open) {
        first = g;
        open = true;
      } else if (!mapped && open) {
        out.emplace_back(a.granule_addr(first), (g - first) * ctx_.granule);
        open = false;
      }
    }
  }
}

void BlockPool::free_mapped_extents(std::size_t& total, std::size_t& largest) const {
  total = largest = 0;
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = *arenas_[i];
    const DevicePtr mapped_end = a.granule_addr(a.high_water());
    std::size_t run = 0;
    auto flush = [&] {
      largest = std::max(largest, run);
      run = 0;
    };
    for (const Block* b = index_.firsts()[i]; b != nullptr; b = b->next) {
      if (!b->is_free()) {
        flush();
        continue;
      }
      scan_mapped(a, b->addr, std::min<DevicePtr>(b->end(), mapped_end), run, total, largest);
      if (b->end() > mapped_end) flush();
    }
    flush();
  }
}

void BlockPool::scan_mapped(const Arena& a, DevicePtr lo, DevicePtr hi, std::size_t& run,
                            std::size_t& total, std::size_t& largest) {
  for (DevicePtr pos = lo; pos < hi;) {
    const std::size_t g = a.granule_of(pos);
    const DevicePtr seg_end = std::min<DevicePtr>(hi, a.granule_addr(g + 1));
    if (a.is_mapped(g)) {
      run += seg_end - pos;
      total += seg_end - pos;
    } else {
      largest = std::max(largest, run);
      run = 0;
    }
    pos = seg_end;
  }
}

void BlockPool::mapped_extents(const Block* b, DevicePtr lo, DevicePtr hi, std::size_t& total,
                               std::size_t& largest) const {
  CUARENA_ASSERT(lo >= b->addr && hi <= b->end(), "mapped_extents: the run must lie inside b");
  std::size_t run = 0;
  scan_mapped(*b->arena, lo, hi, run, total, largest);
  largest = std::max(largest, run);
}

// A physical granule may be active at two addresses (an alias and the retired range it came
// from): it is counted once, under the most-used block over any of them, so the parts add up
// to the physical bytes.
BlockPool::Breakdown BlockPool::breakdown() const {
  Breakdown out;
  auto add = [&](int r) {
    if (r == 3)
      out.allocated += ctx_.granule;
    else if (r == 2)
      out.retired += ctx_.granule;
    else if (r == 1)
      out.owned += ctx_.granule;
    else if (r == 0)
      out.shared += ctx_.granule;
  };
  std::unordered_map<std::uint64_t, int> physical;  // PhysRef (chunk, offset) -> rank
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = *arenas_[i];
    std::vector<int> rank(a.high_water(), -1);
    for (const Block* b = index_.firsts()[i];
         b != nullptr && b->addr < a.granule_addr(a.high_water()); b = b->next) {
      // A block whose sharing is owed is any stream's at the next request: shared.
      const int r = b->allocated ? 3 : b->retired ? 2 : (b->shared || sharing_.owes(b)) ? 0 : 1;
      std::size_t first = 0, last = 0;
      a.covering(b->addr, b->size, first, last);
      for (std::size_t g = first; g < std::min(last, a.high_water()); ++g)
        if (a.is_mapped(g)) rank[g] = std::max(rank[g], r);
    }
    for (std::size_t g = 0; g < rank.size(); ++g) {
      const PhysRef p = a.phys(g);
      if (!p.valid()) {  // a segment's granule: mapped at this address alone
        add(rank[g]);
        continue;
      }
      if (!a.is_mapped(g)) continue;  // dormant: idle below
      int& r = physical.try_emplace(std::uint64_t(p.chunk) << 32 | p.offset, -1).first->second;
      r = std::max(r, rank[g]);
    }
  }
  for (const auto& [ref, r] : physical) add(r);
  out.idle = mappings_.idle_granules() * ctx_.granule;
  return out;
}

}  // namespace cuarena::detail
