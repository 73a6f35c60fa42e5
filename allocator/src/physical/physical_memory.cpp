#include "physical/physical_memory.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "support/assert.hpp"

namespace cuarena::detail {

PhysicalMemory::~PhysicalMemory() {
  for (auto& [id, c] : chunks_) {
    try {
      ctx_.backend.release_physical(c.handle);
    } catch (...) {  // a destructor must not throw; the device is going away anyway
    }
  }
}

PhysRef PhysicalMemory::take_idle() {
  const PhysRef p = idle_.back();
  take(p);
  return p;
}

void PhysicalMemory::take(PhysRef p) {
  Chunk& c = chunks_.at(p.chunk);
  const std::uint32_t pos = c.idle_pos[p.offset];
  CUARENA_ASSERT(pos != kNotIdle, "taking a physical granule that is not idle");
  const PhysRef last = idle_.back();
  idle_[pos] = last;
  chunks_.at(last.chunk).idle_pos[last.offset] = pos;
  idle_.pop_back();
  c.idle_pos[p.offset] = kNotIdle;
  --c.idle;
}

void PhysicalMemory::put_idle(PhysRef p) {
  Chunk& c = chunks_.at(p.chunk);
  c.idle_pos[p.offset] = std::uint32_t(idle_.size());
  idle_.push_back(p);
  ++c.idle;
}

namespace {
void erase_mapping(std::vector<PhysicalMemory::Mapping>& list, PhysicalMemory::Mapping m,
                   const char* what) {
  auto it = std::find(list.begin(), list.end(), m);
  CUARENA_ASSERT(it != list.end(), std::string(what) + " not recorded");
  list.erase(it);
}
}  // namespace

void PhysicalMemory::add_dormant(PhysRef p, Mapping m) {
  chunks_.at(p.chunk).dormant[p.offset].push_back(m);
}

void PhysicalMemory::remove_dormant(PhysRef p, Mapping m) {
  erase_mapping(chunks_.at(p.chunk).dormant[p.offset], m, "removing a dormant mapping");
}

const std::vector<PhysicalMemory::Mapping>& PhysicalMemory::dormant(PhysRef p) const {
  return chunks_.at(p.chunk).dormant[p.offset];
}

PhysRef PhysicalMemory::create(std::size_t granules, bool whole) {
  const std::size_t bytes = granules * ctx_.granule;
  if (ctx_.reserved() + bytes > ctx_.limit) return {};
  const PhysHandle h =
      whole ? ctx_.backend.create_whole_physical(bytes) : ctx_.backend.create_physical(bytes);
  if (h == 0) return {};
  const std::uint32_t id = next_chunk_++;
  Chunk& c = chunks_[id];
  c.handle = h;
  c.whole = whole;
  c.granules = granules;  // all taken by the caller: none idle
  c.idle_pos.assign(granules, kNotIdle);
  c.dormant.resize(granules);
  c.active.resize(granules);
  ++ctx_.stats.num_device_alloc;
  ctx_.add_reserved(Pool::kLarge, std::int64_t(bytes));
  return {id, 0};
}

void PhysicalMemory::discard(std::uint32_t chunk) {
  auto it = chunks_.find(chunk);
  const std::size_t bytes = it->second.granules * ctx_.granule;
  if (it->second.whole) drop_idle_whole(chunk);
  ctx_.backend.release_physical(it->second.handle);
  ++ctx_.stats.num_device_free;
  ctx_.add_reserved(Pool::kLarge, -std::int64_t(bytes));
  if (it->second.home != 0) ctx_.tell_reservation(-std::int64_t(bytes), it->second.home);
  chunks_.erase(it);
}

void PhysicalMemory::add_idle_whole(std::uint32_t chunk) {
  const std::size_t n = chunks_.at(chunk).granules;
  if (idle_whole_.insert({n, chunk}).second) idle_whole_granules_ += n;
}

bool PhysicalMemory::drop_idle_whole(std::uint32_t chunk) {
  const std::size_t n = chunks_.at(chunk).granules;
  if (idle_whole_.erase({n, chunk}) == 0) return false;
  idle_whole_granules_ -= n;
  return true;
}

void PhysicalMemory::take_whole(std::uint32_t chunk) {
  Chunk& c = chunks_.at(chunk);
  const bool idle_whole = c.whole && drop_idle_whole(chunk);  // drops it: not inside the assert
  CUARENA_CHECK(idle_whole, "taking a whole chunk that is not idle");
  c.idle = 0;
}

void PhysicalMemory::put_idle_whole(std::uint32_t chunk) {
  chunks_.at(chunk).idle = chunks_.at(chunk).granules;
  add_idle_whole(chunk);
}

std::uint32_t PhysicalMemory::largest_idle_whole(std::size_t max_granules) const {
  auto it = idle_whole_.upper_bound({max_granules, UINT32_MAX});
  return it == idle_whole_.begin() ? 0 : std::prev(it)->second;
}

void PhysicalMemory::mapped(PhysRef p, Mapping m) {
  Chunk& c = chunks_.at(p.chunk);
  c.active[p.offset].push_back(m);
  if (c.home == 0) {  // reported once mapped: a chunk created and discarded unmapped never is
    c.home = m.arena->granule_addr(m.granule);
    ctx_.tell_reservation(std::int64_t(c.granules * ctx_.granule), c.home);
  }
}

void PhysicalMemory::unmapped(PhysRef p, Mapping m) {
  Chunk& c = chunks_.at(p.chunk);
  auto& list = c.active[p.offset];
  erase_mapping(list, m, "unmapping an active mapping");
  if (!list.empty()) return;
  if (!c.whole)
    put_idle(p);
  else if (++c.idle == c.granules)
    add_idle_whole(p.chunk);
}

std::size_t PhysicalMemory::release_idle_chunks() {
  std::vector<std::uint32_t> idle_chunks;
  for (const auto& [id, c] : chunks_) {
    const bool dormant = std::any_of(c.dormant.begin(), c.dormant.end(),
                                     [](const auto& list) { return !list.empty(); });
    if (c.idle == c.granules && !dormant) idle_chunks.push_back(id);
  }
  std::size_t released = 0;
  for (const std::uint32_t id : idle_chunks) {
    if (!chunks_.at(id).whole)
      idle_.erase(std::remove_if(idle_.begin(), idle_.end(),
                                 [id](const PhysRef& p) { return p.chunk == id; }),
                  idle_.end());
    released += granules(id) * ctx_.granule;
    discard(id);
  }
  for (std::uint32_t i = 0; i < idle_.size(); ++i)
    chunks_.at(idle_[i].chunk).idle_pos[idle_[i].offset] = i;
  return released;
}

}  // namespace cuarena::detail
