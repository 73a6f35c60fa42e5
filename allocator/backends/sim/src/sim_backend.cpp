#include "cuarena/sim_backend.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuarena/errors.hpp"

namespace cuarena {

namespace {
constexpr DevicePtr kVaBase = DevicePtr{1} << 44;  // where simulated address space starts
constexpr DevicePtr kVaEnd = DevicePtr{1} << 47;
}  // namespace

SimBackend::SimBackend(Options options) : options_(options), next_va_(kVaBase) {
  const std::size_t g = options_.granularity;
  if (g < 512 || (g & (g - 1)) != 0)
    throw std::invalid_argument("SimBackend: granularity must be a power of two >= 512");
}

DevicePtr SimBackend::reserve_address(std::size_t bytes) {
  const std::size_t g = options_.granularity;
  if (bytes == 0 || bytes % g != 0)
    throw std::logic_error("SimBackend: reserve_address size not a granule multiple");
  if (bytes > kVaEnd - next_va_) {
    throw BackendError("SimBackend: virtual address space exhausted reserving " +
                       std::to_string(bytes) + " bytes");
  }
  const DevicePtr base = next_va_;
  next_va_ += bytes + g;  // a guard granule between ranges catches overruns
  ranges_.push_back({base, bytes, std::vector<bool>(bytes / g, false)});
  return base;
}

const SimBackend::Range* SimBackend::find_range(DevicePtr va) const {
  for (const Range& r : ranges_) {
    if (va >= r.base && va < r.base + r.size) return &r;
  }
  return nullptr;
}

SimBackend::Range& SimBackend::range_of(DevicePtr va, std::size_t bytes, const char* op) {
  const std::size_t g = options_.granularity;
  const Range* r = find_range(va);
  if (r == nullptr || bytes == 0 || va % g != 0 || bytes % g != 0 ||
      va + bytes > r->base + r->size) {
    throw std::logic_error(std::string("SimBackend: ") + op + " of [" + std::to_string(va) +
                           ", +" + std::to_string(bytes) +
                           ") is not a granule-aligned part of a reserved range");
  }
  return const_cast<Range&>(*r);
}

void SimBackend::release_address(DevicePtr va, std::size_t bytes) {
  Range& r = range_of(va, bytes, "release_address");
  if (r.base != va || r.size != bytes)
    throw std::logic_error("SimBackend: release_address of a range not reserved as such");
  if (std::find(r.mapped.begin(), r.mapped.end(), true) != r.mapped.end())
    throw std::logic_error("SimBackend: release_address of a range still mapped");
  ranges_.erase(ranges_.begin() + (&r - ranges_.data()));
}

bool SimBackend::map(DevicePtr va, std::size_t bytes) {
  Range& r = range_of(va, bytes, "map");
  const std::size_t g = options_.granularity;
  const std::size_t first = (va - r.base) / g, count = bytes / g;
  for (std::size_t i = first; i < first + count; ++i) {
    if (r.mapped[i]) throw std::logic_error("SimBackend: map of an already mapped granule");
  }
  if ((mapped_granules_ + count) * g > options_.capacity) return false;
  for (std::size_t i = first; i < first + count; ++i) r.mapped[i] = true;
  mapped_granules_ += count;
  peak_mapped_granules_ = std::max(peak_mapped_granules_, mapped_granules_);
  ++map_calls_;
  return true;
}

void SimBackend::unmap(DevicePtr va, std::size_t bytes) {
  Range& r = range_of(va, bytes, "unmap");
  const std::size_t g = options_.granularity;
  const std::size_t first = (va - r.base) / g, count = bytes / g;
  for (std::size_t i = first; i < first + count; ++i) {
    if (!r.mapped[i]) throw std::logic_error("SimBackend: unmap of a granule not mapped");
    r.mapped[i] = false;
  }
  mapped_granules_ -= count;
  ++unmap_calls_;
}

bool SimBackend::is_mapped(DevicePtr addr, std::size_t bytes) const {
  if (bytes == 0) return true;
  const Range* r = find_range(addr);
  if (r == nullptr || addr + bytes > r->base + r->size) return false;
  const std::size_t g = options_.granularity;
  for (std::size_t i = (addr - r->base) / g; i <= (addr + bytes - 1 - r->base) / g; ++i) {
    if (!r->mapped[i]) return false;
  }
  return true;
}

EventId SimBackend::record_event(StreamId) {
  const EventId id = next_event_++;
  events_.emplace(id, now_ + options_.event_latency);
  return id;
}

bool SimBackend::event_completed(EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) throw std::logic_error("SimBackend: query of an unknown event");
  return now_ >= it->second;
}

void SimBackend::wait_event(EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) throw std::logic_error("SimBackend: wait on an unknown event");
  now_ = std::max(now_, it->second);
}

void SimBackend::release_event(EventId event) {
  if (events_.erase(event) == 0) throw std::logic_error("SimBackend: release of an unknown event");
}

}  // namespace cuarena
