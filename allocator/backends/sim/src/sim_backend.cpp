#include "cuarena/sim_backend.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/types.hpp"

namespace cuarena {

namespace {
constexpr DevicePtr kVaBase = DevicePtr{1} << 44;  // where simulated address space starts
constexpr DevicePtr kVaEnd = DevicePtr{1} << 47;

[[noreturn]] void misuse(const std::string& what) { throw std::logic_error("SimBackend: " + what); }

// Devices map in granules of 64 KiB (older GPUs) to 2 MiB; smaller ones would make the
// simulator's per-granule tables huge for nothing.
constexpr std::size_t kMinGranularity = 64 * KiB;
// sim_capacity's values: 0 keeps its documented meaning, the default device.
constexpr char kCapacityValues[] = "0, or a size from one granule (sim_granularity) to 16TiB";
}  // namespace

const ConfigTable<SimConfig>& SimConfig::table() {
  using S = SimConfig;
  static const ConfigTable<SimConfig> rows = {
      uint_key("sim_event_latency", &S::event_latency, 0, std::uint64_t{1} << 30,
               "simulator: how far the device runs behind, in trace events: an event completes "
               "this many events after its stream's last work (a replayed event on it)"),
      {"sim_capacity", kCapacityValues,
       "simulator: device bytes (0: " + size_text(SimBackend::kDefaultCapacity) + ")",
       [](S& s, const ConfigItem& i) {
         // Below the smallest granule is never a device; against sim_granularity itself (which
         // may come later in the string) check() holds it.
         s.capacity = read_size(i, 0, kMaxDeviceBytes);
         if (s.capacity != 0 && s.capacity < kMinGranularity) i.bad(kCapacityValues);
       },
       [](const S& s) { return size_text(s.capacity); }},
      size_key("sim_granularity", &S::granularity, kMinGranularity, 1 * GiB,
               "simulator: granule size", /*pow2=*/true),
  };
  return rows;
}

void SimConfig::check() const {
  if (capacity != 0 && capacity < granularity)
    throw ConfigError("cuarena config: sim_capacity " + size_text(capacity) +
                      " is less than one granule (sim_granularity " + size_text(granularity) +
                      "): expected " + kCapacityValues);
}

SimBackend::SimBackend(Options options) : options_(options), next_va_(kVaBase) {
  const std::size_t g = options_.granularity;
  if (g < 512 || (g & (g - 1)) != 0)
    throw std::invalid_argument("SimBackend: granularity must be a power of two >= 512");
}

void SimBackend::require_mapping(const char* op) const {
  if (options_.segments) misuse(std::string(op) + " on a segment backend (no mapping)");
}

DevicePtr SimBackend::reserve_address(std::size_t bytes) {
  require_mapping("reserve_address");
  return reserve(bytes);
}

DevicePtr SimBackend::reserve(std::size_t bytes) {
  const std::size_t g = options_.granularity;
  if (bytes == 0 || bytes % g != 0) misuse("reserve_address size not a granule multiple");
  if (bytes > kVaEnd - next_va_) {
    throw BackendError("SimBackend: virtual address space exhausted reserving " +
                       std::to_string(bytes) + " bytes");
  }
  const DevicePtr base = next_va_;
  next_va_ += bytes + g;                         // a guard granule between ranges catches overruns
  ranges_.push_back({base, bytes, {}, {}, {}});  // granule tables grow as granules are mapped
  return base;
}

void SimBackend::grow(Range& r, std::size_t granules) {
  r.mapped.resize(granules, 0);
  r.offset.resize(granules, 0);
  r.access.resize(granules, false);
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
    misuse(std::string(op) + " of [" + std::to_string(va) + ", +" + std::to_string(bytes) +
           ") is not a granule-aligned part of a reserved range");
  }
  return const_cast<Range&>(*r);
}

void SimBackend::release_address(DevicePtr va, std::size_t bytes) {
  Range& r = range_of(va, bytes, "release_address");
  if (r.base != va || r.size != bytes || r.segment)
    misuse("release_address of a range not reserved as such");
  if (std::any_of(r.mapped.begin(), r.mapped.end(), [](PhysHandle h) { return h != 0; }))
    misuse("release_address of a range still mapped");
  ranges_.erase(ranges_.begin() + (&r - ranges_.data()));
}

PhysHandle SimBackend::create_physical(std::size_t bytes) {
  require_mapping("create_physical");
  if (bytes == 0 || bytes % options_.granularity != 0)
    misuse("create_physical size not a granule multiple");
  if (physical_bytes_ + bytes > options_.capacity) return 0;
  const PhysHandle h = next_chunk_++;
  chunks_.emplace(h, Chunk{bytes});
  physical_bytes_ += bytes;
  peak_physical_bytes_ = std::max(peak_physical_bytes_, physical_bytes_);
  return h;
}

std::size_t SimBackend::live_whole_chunks() const {
  return std::size_t(
      std::count_if(chunks_.begin(), chunks_.end(), [](const auto& c) { return c.second.whole; }));
}

PhysHandle SimBackend::create_whole_physical(std::size_t bytes) {
  const PhysHandle h = create_physical(bytes);
  if (h != 0) chunks_.at(h).whole = true;
  return h;
}

void SimBackend::release_physical(PhysHandle chunk) {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) misuse("release_physical of an unknown chunk");
  if (it->second.mappings != 0) misuse("release_physical of a chunk still mapped");
  physical_bytes_ -= it->second.bytes;
  chunks_.erase(it);
}

void SimBackend::map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) {
  map_granules(va, bytes, chunk, offset, true);
}

void SimBackend::map_no_access(DevicePtr va, std::size_t bytes, PhysHandle chunk,
                               std::size_t offset) {
  map_granules(va, bytes, chunk, offset, false);
}

bool SimBackend::one_mapping(const Range& r, std::size_t i) const {
  const std::size_t g = options_.granularity;
  return i + 1 < r.mapped.size() && r.mapped[i] != 0 && chunks_.at(r.mapped[i]).whole &&
         r.mapped[i + 1] == r.mapped[i] && r.offset[i + 1] == r.offset[i] + g;
}

SimBackend::Span SimBackend::whole_mappings(DevicePtr va, std::size_t bytes, const char* op) {
  require_mapping(op);
  Range& r = range_of(va, bytes, op);
  const std::size_t g = options_.granularity;
  const Span span{r, (va - r.base) / g, bytes / g};
  for (std::size_t i = span.first; i < span.first + span.count; ++i) {
    if (i >= r.mapped.size() || r.mapped[i] == 0)
      misuse(std::string(op) + " of a granule not mapped");
  }
  // A whole chunk's mapping may not straddle either end. (The same chunk may also be mapped
  // again right next to itself.)
  if ((span.first > 0 && one_mapping(r, span.first - 1)) ||
      (span.first + span.count < r.mapped.size() && one_mapping(r, span.first + span.count - 1)))
    misuse(std::string(op) + " of part of a whole chunk's mapping");
  return span;
}

void SimBackend::set_access(DevicePtr va, std::size_t bytes) {
  const Span span = whole_mappings(va, bytes, "set_access");
  for (std::size_t i = span.first; i < span.first + span.count; ++i) span.r.access[i] = true;
  ++set_access_calls_;
}

void SimBackend::map_granules(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset,
                              bool access) {
  require_mapping("map");
  Range& r = range_of(va, bytes, "map");
  auto it = chunks_.find(chunk);
  const std::size_t g = options_.granularity;
  if (it == chunks_.end()) misuse("map of an unknown chunk");
  if (offset % g != 0 || offset + bytes > it->second.bytes) misuse("map beyond its chunk");
  if (it->second.whole && (offset != 0 || bytes != it->second.bytes))
    misuse("map of part of a whole chunk");
  const std::size_t first = (va - r.base) / g, count = bytes / g;
  if (r.mapped.size() < first + count) grow(r, first + count);
  for (std::size_t i = first; i < first + count; ++i) {
    if (r.mapped[i] != 0) misuse("map over an already mapped granule");
  }
  for (std::size_t i = first; i < first + count; ++i) {
    r.mapped[i] = chunk;
    r.offset[i] = offset + (i - first) * g;
    r.access[i] = access;
  }
  it->second.mappings += count;
  ++map_calls_;
}

void SimBackend::unmap(DevicePtr va, std::size_t bytes) {
  const Span span = whole_mappings(va, bytes, "unmap");
  for (std::size_t i = span.first; i < span.first + span.count; ++i) {
    --chunks_.at(span.r.mapped[i]).mappings;
    span.r.mapped[i] = 0;
    span.r.access[i] = false;
  }
  ++unmap_calls_;
}

DevicePtr SimBackend::allocate_segment(std::size_t bytes, StreamId) {
  if (!options_.segments) misuse("allocate_segment on a mapping backend");
  if (bytes == 0 || bytes % options_.granularity != 0)
    misuse("allocate_segment size not a granule multiple");
  if (physical_bytes_ + bytes > options_.capacity) return 0;
  const DevicePtr base = reserve(bytes);
  const PhysHandle h = next_chunk_++;
  chunks_.emplace(h, Chunk{bytes, bytes / options_.granularity});
  Range& r = ranges_.back();
  r.segment = true;
  grow(r, bytes / options_.granularity);
  std::fill(r.mapped.begin(), r.mapped.end(), h);
  r.access.assign(r.access.size(), true);
  physical_bytes_ += bytes;
  peak_physical_bytes_ = std::max(peak_physical_bytes_, physical_bytes_);
  return base;
}

void SimBackend::free_segment(DevicePtr ptr, std::size_t bytes) {
  const Range* r = find_range(ptr);
  if (r == nullptr || !r->segment || r->base != ptr || r->size != bytes)
    misuse("free_segment of [" + std::to_string(ptr) + ", +" + std::to_string(bytes) +
           ") that is not a live segment");
  chunks_.erase(r->mapped.front());
  physical_bytes_ -= bytes;
  ranges_.erase(ranges_.begin() + (r - ranges_.data()));
}

SimBackend::Backing SimBackend::backing(DevicePtr addr) const {
  const Range* r = find_range(addr);
  if (r == nullptr) return {};
  const std::size_t g = options_.granularity;
  const std::size_t i = (addr - r->base) / g;
  if (i >= r->mapped.size() || r->mapped[i] == 0) return {};
  const std::size_t in_granule = (addr - r->base) % g;
  return {r->mapped[i], r->segment ? addr - r->base : r->offset[i] + in_granule};
}

bool SimBackend::is_mapped(DevicePtr addr, std::size_t bytes) const {
  if (bytes == 0) return true;
  const Range* r = find_range(addr);
  if (r == nullptr || addr + bytes > r->base + r->size) return false;
  const std::size_t g = options_.granularity;
  for (std::size_t i = (addr - r->base) / g; i <= (addr + bytes - 1 - r->base) / g; ++i) {
    if (i >= r->mapped.size() || r->mapped[i] == 0 || !r->access[i]) return false;
  }
  return true;
}

EventId SimBackend::record_event(StreamId stream) {
  if (!captured_.empty() && captured_.count(stream) != 0)
    misuse("an event recorded on stream " + std::to_string(stream) + " while it is captured");
  const EventId id = next_event_++;
  const std::uint64_t latency = options_.event_latency;
  std::uint64_t completes = now_ + latency;
  if (const auto w = last_work_.find(stream); w != last_work_.end())
    completes = std::max(w->second + latency, now_ + std::min<std::uint64_t>(latency, 1));
  Event e{completes, stream, {}, now_, 0, {}};
  for (const auto& [key, reach] : waited_) {
    if (key.first == stream) e.inherited.emplace_back(key.second, reach);
  }
  if (!held_streams_.empty() && held_streams_.count(stream) != 0) e.held_by.push_back(stream);
  if (const auto f = waits_.find(stream); f != waits_.end()) {
    e.completes = std::max(e.completes, f->second.floor);
    e.floor = f->second.floor;
    std::erase_if(f->second.held, [&](StreamId s) { return held_streams_.count(s) == 0; });
    for (const StreamId s : f->second.held) {
      if (s != stream) e.held_by.push_back(s);
    }
  }
  held_events_ += e.held();
  events_.emplace(id, std::move(e));
  return id;
}

bool SimBackend::event_completed(EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) misuse("query of an unknown event");
  return !it->second.held() && now_ >= it->second.completes;
}

void SimBackend::wait_event(EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) misuse("wait on an unknown event");
  if (it->second.held()) {
    it->second.held_by.clear();
    --held_events_;
  }
  now_ = std::max(now_, it->second.completes);
}

void SimBackend::release_event(EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) misuse("release of an unknown event");
  held_events_ -= it->second.held();
  events_.erase(it);
}

bool SimBackend::stream_wait_event(StreamId stream, EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) misuse("stream wait on an unknown event");
  if (!captured_.empty() && captured_.count(stream) != 0)
    misuse("stream " + std::to_string(stream) + " made to wait while it is captured");
  const Event& e = it->second;
  if (e.stream == stream) return true;  // stream order already
  Waits& w = waits_[stream];
  w.floor = std::max(w.floor, e.completes);
  for (const StreamId s : e.held_by) {  // its later work waits for those streams' release too
    if (std::find(w.held.begin(), w.held.end(), s) == w.held.end()) w.held.push_back(s);
  }
  std::uint64_t& reach = waited_[{stream, e.stream}];
  reach = std::max(reach, e.recorded + 1);
  for (const auto& [other, r] : e.inherited) {
    if (other == stream) continue;
    std::uint64_t& via = waited_[{stream, other}];
    via = std::max(via, r);
  }
  return true;
}

bool SimBackend::waited_for(StreamId stream, StreamId other, std::uint64_t tick) const {
  const auto it = waited_.find({stream, other});
  return it != waited_.end() && it->second > tick;
}

void SimBackend::hold_stream(StreamId stream) { held_streams_.insert(stream); }

void SimBackend::release_stream(StreamId stream) {
  if (held_streams_.erase(stream) == 0 || held_events_ == 0) return;
  for (auto& [id, e] : events_) {
    // The stream's work is done: its events (and those waiting for it alone) complete now.
    if (std::erase(e.held_by, stream) != 0 && !e.held()) {
      e.completes = std::max(std::min(e.completes, now_), e.floor);
      --held_events_;
    }
  }
}

}  // namespace cuarena
