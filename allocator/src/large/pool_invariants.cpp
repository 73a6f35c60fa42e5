// The block pool's and the physical pool's invariants, checked whole (tests call
// Allocator::check_invariants() after every step; CUARENA_DEBUG=3 builds at each operation).
// Each check names the first broken invariant in a std::logic_error; the invariants themselves
// are stated where they are kept (free_index.hpp, sharing.hpp, physical_memory.hpp).
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "large/block_pool.hpp"
#include "physical/physical_memory.hpp"

namespace cuarena::detail {

namespace {
[[noreturn]] void broken(const std::string& what) {
  throw std::logic_error("cuarena invariant violated: " + what);
}
}  // namespace

void BlockPool::check_invariants() const {
  index_.check_invariants();
  sharing_.check_invariants();
  // What the index cannot see: the granules under each block, and merges owed sharing holds.
  std::size_t segment_bytes = 0;
  std::vector<const Arena*> arenas;  // mapped ones, for the physical pool's check
  for (std::size_t i = 0; i < arenas_.size(); ++i) {
    const Arena& a = *arenas_[i];
    if (a.segment() != segments_) broken("arena kind differs from the backend's");
    if (a.segment())
      segment_bytes += a.size();
    else
      arenas.push_back(&a);
    const Block* prev = nullptr;
    for (const Block* b = index_.firsts()[i]; b != nullptr; prev = b, b = b->next) {
      const std::string at = "block at " + std::to_string(b->addr);
      std::size_t first = 0, last = 0;
      a.covering(b->addr, b->size, first, last);
      const bool fully_mapped = a.count_unmapped(first, last) == 0;
      if (b->allocated) {
        if (!fully_mapped && !b->lazy) broken(at + ": allocated block not fully mapped");
        continue;
      }
      if (b->lazy && (b->retired || b->shared)) broken(at + ": lazy block retired or shared");
      if (b->retired) {
        if (!fully_mapped || b->addr % ctx_.granule || b->size % ctx_.granule)
          broken(at + ": retired block not granule-aligned and mapped");
        continue;
      }
      if (prev && FreeIndex::mergeable(prev, b, [&](const Block* x) { return sharing_.owes(x); }))
        broken(at + ": mergeable free neighbours not coalesced");
      if (b->shared) {
        std::size_t ifirst = 0, ilast = 0;
        a.interior(b->addr, b->size, ifirst, ilast);
        ilast = std::min(ilast, a.high_water());
        if (!a.segment() && !b->lru.linked) {
          for (std::size_t g = ifirst; g < ilast; ++g) {
            if (!a.is_mapped(g)) continue;
            const Mappings::Extent e = mapping_extent(a.phys(g), g);
            const bool stealable = e.first >= ifirst && e.first + e.count <= ilast;
            if (stealable)
              broken(at + ": shared block caches stealable granules but is not in the LRU list");
          }
        }
      } else if (!index_.unified() && !b->lazy && !fully_mapped) {
        broken(at + ": owned free block not fully mapped");
      }
    }
  }
  if (segment_bytes != mappings_.segment_bytes()) broken("segment bytes disagree with the arenas");
  if (segments_ && !index_.warm().empty()) broken("a segment block is in the LRU list");
  mappings_.phys().check_invariants(arenas, ctx_.reserved() - mappings_.segment_bytes());
}

void PhysicalMemory::check_invariants(const std::vector<const Arena*>& arenas,
                                      std::size_t expected_bytes) const {
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::size_t> seen;
  std::size_t dormant_seen = 0;
  for (const Arena* a : arenas) {
    for (std::size_t g = 0; g < a->high_water(); ++g) {
      const PhysRef p = a->phys(g);
      if (a->is_mapped(g)) {
        ++seen[{p.chunk, p.offset}];
        const auto& list = chunks_.at(p.chunk).active.at(p.offset);
        if (std::find(list.begin(), list.end(), Mapping{a, g}) == list.end())
          throw std::logic_error("cuarena invariant violated: an active mapping is not recorded");
      }
      if (!a->is_dormant(g)) continue;
      ++dormant_seen;
      const auto& list = chunks_.at(p.chunk).dormant.at(p.offset);
      if (std::find(list.begin(), list.end(), Mapping{a, g}) == list.end())
        throw std::logic_error("cuarena invariant violated: a dormant mapping is not recorded");
    }
  }
  std::size_t dormant_listed = 0;
  for (const auto& [id, c] : chunks_) {
    for (const auto& list : c.dormant) {
      dormant_listed += list.size();
      if (list.size() > ctx_.config.dormant_maps)
        throw std::logic_error(
            "cuarena invariant violated: more dormant mappings than dormant_maps");
    }
  }
  if (dormant_listed != dormant_seen)
    throw std::logic_error("cuarena invariant violated: dormant mappings recorded twice or stale");
  // Each mapping of a whole chunk must be all of it, in order.
  for (const Arena* a : arenas) {
    for (std::size_t g = 0; g < a->high_water(); ++g) {
      if (!a->has_mapping(g)) continue;
      const PhysRef p = a->phys(g);
      const Chunk& c = chunks_.at(p.chunk);
      if (!c.whole || p.offset != 0) continue;
      for (std::uint32_t o = 0; o < c.granules; ++o) {
        if (a->phys(g + o) != PhysRef{p.chunk, o} || a->is_dormant(g + o) != a->is_dormant(g))
          throw std::logic_error("cuarena invariant violated: a whole chunk mapped in part");
      }
    }
  }
  std::size_t total = 0, idle = 0;
  for (const auto& [id, c] : chunks_) {
    total += c.granules;
    std::size_t chunk_idle = 0;
    for (std::uint32_t o = 0; o < c.granules; ++o) {
      auto it = seen.find({id, o});
      const std::size_t n = it == seen.end() ? 0 : it->second;
      if (n != c.active[o].size())
        throw std::logic_error("cuarena invariant violated: physical granule map count wrong");
      chunk_idle += n == 0;
      if (!c.whole && (c.idle_pos[o] != kNotIdle) != (n == 0))
        throw std::logic_error(
            "cuarena invariant violated: idle position disagrees with map count");
      if (c.idle_pos[o] != kNotIdle &&
          (c.idle_pos[o] >= idle_.size() || idle_[c.idle_pos[o]] != PhysRef{id, o}))
        throw std::logic_error("cuarena invariant violated: idle position is stale");
    }
    if (chunk_idle != c.idle)
      throw std::logic_error("cuarena invariant violated: chunk idle count wrong");
    if (!c.whole)
      idle += chunk_idle;
    else if (chunk_idle != 0 && chunk_idle != c.granules)
      throw std::logic_error("cuarena invariant violated: a whole chunk partly mapped");
  }
  if (idle != idle_.size())
    throw std::logic_error("cuarena invariant violated: idle list disagrees with map counts");
  for (const auto& [id, c] : chunks_) {
    if (c.whole && (c.idle == c.granules) != (idle_whole_.count({c.granules, id}) == 1))
      throw std::logic_error(
          "cuarena invariant violated: idle whole chunks disagree with map counts");
  }
  std::size_t idle_whole = 0;
  for (const auto& [granules, id] : idle_whole_) {
    if (!chunks_.count(id))
      throw std::logic_error("cuarena invariant violated: a released chunk is idle");
    idle_whole += granules;
  }
  if (idle_whole != idle_whole_granules_)
    throw std::logic_error("cuarena invariant violated: idle whole granules miscounted");
  if (total * ctx_.granule != expected_bytes)
    throw std::logic_error("cuarena invariant violated: chunks disagree with reserved_bytes");
}

}  // namespace cuarena::detail
