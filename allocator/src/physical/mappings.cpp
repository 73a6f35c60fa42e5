#include "physical/mappings.hpp"

#include <algorithm>

#include "tuning.hpp"

namespace cuarena::detail {

// --- Address space and segments -------------------------------------------------------------

std::unique_ptr<Arena> Mappings::reserve(std::size_t bytes) {
  const DevicePtr base = ctx_.backend.reserve_address(bytes);
  return std::make_unique<Arena>(base, bytes, ctx_.granule);
}

std::unique_ptr<Arena> Mappings::allocate_segment(std::size_t bytes, StreamId stream) {
  const DevicePtr base = ctx_.backend.allocate_segment(bytes, stream);
  if (base == 0) return nullptr;
  ++ctx_.stats.num_device_alloc;
  segment_bytes_ += bytes;
  ctx_.add_reserved(Pool::kLarge, std::int64_t(bytes));
  ctx_.tell_reservation(std::int64_t(bytes), base);
  return std::make_unique<Arena>(base, bytes, ctx_.granule, /*segment=*/true);
}

void Mappings::free_segment(const Arena& a) {
  ctx_.backend.free_segment(a.base(), a.size());
  ++ctx_.stats.num_device_free;
  segment_bytes_ -= a.size();
  ctx_.add_reserved(Pool::kLarge, -std::int64_t(a.size()));
  ctx_.tell_reservation(-std::int64_t(a.size()), a.base());
}

void Mappings::release(Arena& a) noexcept {
  // A destructor's helper: errors are swallowed, the device is going away anyway.
  if (a.segment()) {
    try {
      ctx_.backend.free_segment(a.base(), a.size());
    } catch (...) {
    }
    return;
  }
  for (std::size_t g = 0, hw = a.high_water(); g < hw;) {
    if (!a.has_mapping(g)) {
      ++g;
      continue;
    }
    const std::size_t n = extent(a.phys(g), g).count;  // g starts the mapping
    try {
      unmap(a, g, n);
    } catch (...) {
    }
    g += n;
  }
  try {
    ctx_.backend.release_address(a.base(), a.size());
  } catch (...) {
  }
}

// --- Changing mappings ----------------------------------------------------------------------

void Mappings::unmap(Arena& a, std::size_t first, std::size_t count) {
  ctx_.backend.unmap(a.granule_addr(first), count * ctx_.granule);
  for (std::size_t g = first; g < first + count; ++g) {
    if (a.is_dormant(g))
      phys_.remove_dormant(a.phys(g), {&a, g});
    else
      phys_.unmapped(a.phys(g), {&a, g});
    a.clear(g);
  }
  ++ctx_.stats.unmap_calls;
  ctx_.stats.granules_unmapped += std::int64_t(count);
}

void Mappings::make_dormant(Arena& a, std::size_t g) {
  const unsigned cap = ctx_.config.dormant_maps;
  const auto [start, n] = extent(a.phys(g), g);
  if (cap == 0) {
    unmap(a, start, n);
    return;
  }
  for (std::size_t k = start; k < start + n; ++k) {
    const PhysRef q = a.phys(k);
    a.set_dormant(k, true);
    phys_.unmapped(q, {&a, k});
    phys_.add_dormant(q, {&a, k});
  }
  const PhysRef head = a.phys(start);
  if (phys_.dormant(head).size() > cap) {
    const PhysicalMemory::Mapping oldest = phys_.dormant(head).front();
    unmap(const_cast<Arena&>(*oldest.arena), oldest.granule, n);
  }
}

std::size_t Mappings::reactivate(Arena& a, std::vector<std::size_t>& holes, bool& spilled) {
  std::size_t n = 0;
  for (const std::size_t g : holes) {
    if (!a.is_dormant(g)) continue;
    const PhysRef p = a.phys(g);
    if (!idle(p)) continue;
    if (phys_.whole(p.chunk))
      phys_.take_whole(p.chunk);
    else
      phys_.take(p);
    const auto [start, count] = extent(p, g);  // a whole chunk comes back whole
    for (std::size_t k = start; k < start + count; ++k) {
      const PhysRef q = a.phys(k);
      phys_.remove_dormant(q, {&a, k});
      phys_.mapped(q, {&a, k});
      a.set_dormant(k, false);
    }
    n += count;
    spilled |= start < holes.front() || start + count > holes.back() + 1;
  }
  if (n == 0) return 0;
  holes.erase(
      std::remove_if(holes.begin(), holes.end(), [&](std::size_t g) { return a.is_mapped(g); }),
      holes.end());
  ctx_.stats.granules_reactivated += std::int64_t(n);
  return n;
}

void Mappings::unmap_all_dormant(Arena& a) {
  for (std::size_t g = 0; g < a.high_water();) {
    std::size_t end = g;
    while (end < a.high_water() && a.is_dormant(end)) ++end;
    if (end > g) unmap(a, g, end - g);
    g = end + 1;
  }
}

void Mappings::unmap_dormant(Arena& a, const std::vector<std::size_t>& holes) {
  // One call per run of dormant movable granules; a whole chunk's mapping goes whole, even
  // where it reaches past the holes into the free block above.
  for (std::size_t i = 0; i < holes.size();) {
    const std::size_t g = holes[i];
    if (!a.is_dormant(g)) {
      ++i;
      continue;
    }
    if (phys_.whole(a.phys(g).chunk)) {
      const Extent e = extent(a.phys(g), g);
      unmap(a, e.first, e.count);
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < holes.size() && holes[j] == holes[j - 1] + 1 && a.is_dormant(holes[j]) &&
           !phys_.whole(a.phys(holes[j]).chunk))
      ++j;
    unmap(a, g, j - i);
    i = j;
  }
}

void Mappings::release_idle_whole(std::uint32_t chunk) {
  const PhysRef first{chunk, 0};
  while (!phys_.dormant(first).empty()) {
    const PhysicalMemory::Mapping m = phys_.dormant(first).front();
    unmap(const_cast<Arena&>(*m.arena), m.granule, phys_.granules(chunk));
  }
  phys_.discard(chunk);
}

// --- Backing a request ----------------------------------------------------------------------

void Mappings::pack_whole(Backing& r) {
  // Each run of consecutive holes takes the largest idle whole chunks that fit it, in order.
  const std::vector<std::size_t>& holes = r.holes;
  r.supply.assign(holes.size(), PhysRef{});
  for (std::size_t i = 0; i < holes.size() && !phys_.idle_whole_empty();) {
    std::size_t j = i + 1;
    while (j < holes.size() && holes[j] == holes[j - 1] + 1) ++j;
    while (j - i >= 2) {
      const std::uint32_t c = phys_.largest_idle_whole(j - i);
      if (c == 0) break;
      phys_.take_whole(c);
      r.wholes.push_back(c);
      const std::size_t n = phys_.granules(c);
      for (std::size_t k = 0; k < n; ++k) r.supply[i + k] = {c, std::uint32_t(k)};
      i += n;
      r.packed += n;
    }
    i = j;
  }
}

bool Mappings::fill(Backing& r, std::size_t soft) {
  const std::size_t gran = ctx_.granule;
  const std::size_t rest = r.holes.size() - r.packed;
  const std::size_t fresh = rest - std::min(rest, phys_.idle_granules() + r.aliases.size());
  // Whole chunks that fit nowhere here are released before growing past the soft limit: their
  // bytes come back in the shape needed (a few calls instead of one per granule).
  while (fresh > 0 && ctx_.reserved() + fresh * gran > soft && !phys_.idle_whole_empty())
    release_idle_whole(phys_.idle_whole().rbegin()->second);
  std::vector<PhysRef> taken;  // idle granules, given back if the device refuses
  auto give_back = [&] {
    for (const PhysRef& p : taken) phys_.put_idle(p);
    for (const std::uint32_t c : r.wholes) phys_.put_idle_whole(c);
  };
  if (ctx_.reserved() + fresh * gran > std::min(ctx_.limit, ctx_.grow_ceiling)) {
    give_back();
    return false;
  }
  while (r.aliases.size() + taken.size() < rest && phys_.idle_granules() > 0)
    taken.push_back(phys_.take_idle());
  // Aliases go only to holes wholly inside the request; idle granules fill the rest, then
  // fresh ones.
  std::vector<std::size_t> unfilled;
  std::size_t next_alias = 0, next_taken = 0;
  for (std::size_t i = 0; i < r.holes.size(); ++i) {
    if (r.supply[i].valid()) continue;
    if (next_alias < r.aliases.size() && r.inside(r.holes[i]))
      r.supply[i] = r.aliases[next_alias++];
    else if (next_taken < taken.size())
      r.supply[i] = taken[next_taken++];
    else
      unfilled.push_back(i);
  }
  if (!create_fresh(r.holes, unfilled, r.supply)) {
    give_back();
    return false;  // the device refused; aliased granules return after their sweep
  }
  r.idle_taken = taken.size();
  return true;
}

void Mappings::map(Arena& a, const Backing& r) {
  unmap_dormant(a, r.holes);
  map_granules(a, r.holes, r.supply);
  ctx_.stats.granules_aliased += std::int64_t(r.aliases.size() + r.aliased_whole);
  if (r.reclaimed_idle + r.aliases.size() + r.packed + r.idle_taken > 0)
    ++ctx_.stats.stitched_ranges;
}

bool Mappings::create_fresh(const std::vector<std::size_t>& holes,
                            const std::vector<std::size_t>& unfilled,
                            std::vector<PhysRef>& supply) {
  // Runs of consecutive hole granules long enough become whole chunks; the rest one chunk of
  // movable granules. Memory first (near the limit, the pool turned so: stop_whole_chunks()),
  // single granules only: they can move wherever the next request needs them.
  const std::size_t min_run =
      ctx_.config.whole_chunk_min == 0 || singles_only_
          ? SIZE_MAX
          : std::max(tuning::kMinWholeRunGranules, ctx_.config.whole_chunk_min / ctx_.granule);
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // [begin, end) into `unfilled`
  std::vector<std::size_t> singles;
  for (std::size_t i = 0; i < unfilled.size();) {
    std::size_t j = i + 1;
    while (j < unfilled.size() && holes[unfilled[j]] == holes[unfilled[j - 1]] + 1) ++j;
    if (j - i >= min_run)
      runs.emplace_back(i, j);
    else
      for (std::size_t k = i; k < j; ++k) singles.push_back(unfilled[k]);
    i = j;
  }
  std::vector<std::uint32_t> made;
  auto fail = [&] {
    for (std::uint32_t c : made) phys_.discard(c);
    return false;
  };
  // A run longer than whole_chunk_max, or than 1/16 of the memory already reserved (but at
  // least 32 MiB), becomes equal pieces: a chunk partly under a live block cannot move, so
  // smaller pieces strand less memory, and a small workload gets small chunks
  // (docs/results.md).
  std::size_t cap = ctx_.config.whole_chunk_max == 0 ? SIZE_MAX : ctx_.config.whole_chunk_max;
  cap = std::min(
      cap, std::max(tuning::kWholeChunkMinCap, ctx_.reserved() / tuning::kWholeChunkReservedShare));
  const std::size_t max_run = cap == SIZE_MAX ? SIZE_MAX : std::max(min_run, cap / ctx_.granule);
  for (const auto& [run_begin, run_end] : runs) {
    const std::size_t len = run_end - run_begin, pieces = len / max_run + (len % max_run != 0);
    for (std::size_t piece = 0; piece < pieces; ++piece) {
      const std::size_t i = run_begin + len * piece / pieces;
      const std::size_t j = run_begin + len * (piece + 1) / pieces;
      const PhysRef c = phys_.create(j - i, /*whole=*/true);
      if (!c.valid()) return fail();
      made.push_back(c.chunk);
      for (std::size_t k = i; k < j; ++k) supply[unfilled[k]] = {c.chunk, std::uint32_t(k - i)};
    }
  }
  if (!singles.empty()) {
    const PhysRef c = phys_.create(singles.size());
    if (!c.valid()) return fail();
    for (std::size_t k = 0; k < singles.size(); ++k)
      supply[singles[k]] = {c.chunk, std::uint32_t(k)};
  }
  return true;
}

void Mappings::map_granules(Arena& a, const std::vector<std::size_t>& granules,
                            const std::vector<PhysRef>& phys) {
  // One map call per run of consecutive virtual granules backed by consecutive granules of one
  // chunk, and one access grant over several runs: `granules` are the holes of one request's
  // range, so every granule between two of them is mapped already, by mappings lying wholly
  // between them. A grant's cost follows the mappings it spans more than its bytes
  // (docs/results.md), so runs far apart get their own.
  std::size_t span_begin = 0, span_end = 0;  // granules of the pending grant; empty if equal
  auto grant = [&] {
    if (span_end == span_begin) return;
    ctx_.backend.set_access(a.granule_addr(span_begin), (span_end - span_begin) * ctx_.granule);
    ++ctx_.stats.access_calls;
    span_begin = span_end = 0;
  };
  for (std::size_t i = 0; i < granules.size();) {
    std::size_t j = i + 1;
    while (j < granules.size() && granules[j] == granules[j - 1] + 1 &&
           phys[j].chunk == phys[i].chunk && phys[j].offset == phys[j - 1].offset + 1)
      ++j;
    const std::size_t count = j - i;
    if (span_end != span_begin && granules[i] - span_end > tuning::kMaxAccessGapGranules) grant();
    ctx_.backend.map_no_access(a.granule_addr(granules[i]), count * ctx_.granule,
                               phys_.handle(phys[i].chunk),
                               std::size_t(phys[i].offset) * ctx_.granule);
    for (std::size_t k = i; k < j; ++k) {
      a.set(granules[k], phys[k]);
      phys_.mapped(phys[k], {&a, granules[k]});
    }
    if (span_end == span_begin) span_begin = granules[i];
    span_end = granules[i] + count;
    ++ctx_.stats.map_calls;
    ctx_.stats.granules_mapped += std::int64_t(count);
    i = j;
  }
  grant();
}

}  // namespace cuarena::detail
