// Helpers shared by the core unit tests.
#pragma once

#include <cstdint>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/sim_backend.hpp"

namespace cuarena::test {

inline constexpr std::size_t kGranule = 2 * MiB;

inline SimBackend::Options sim_options(std::size_t capacity = 1 * GiB, std::uint64_t latency = 1) {
  SimBackend::Options o;
  o.capacity = capacity;
  o.granularity = kGranule;
  o.event_latency = latency;
  return o;
}

inline DevicePtr addr(void* p) { return reinterpret_cast<DevicePtr>(p); }

inline std::int64_t reserved(const Allocator& a) {
  return a.stats().reserved_bytes[int(Pool::kAll)].current;
}

/// The allocator's modes a behaviour must hold in: the default (whole chunks), memory first, loop
/// plans, and a segment upstream (cudaMalloc-like). For INSTANTIATE_TEST_SUITE_P with ValuesIn.
struct Mode {
  const char* name;
  const char* config;
  bool segments;  // SimBackend::Options::segments
};
inline constexpr Mode kModes[] = {{"whole_chunks", "", false},
                                  {"memory_first", "whole_chunk_min:0", false},
                                  {"loop_plan", "loop_plan:True", false},
                                  {"segments", "upstream:malloc", true}};

/// kModes but segments: the modes that map granules on demand.
inline std::vector<Mode> mapped_modes() {
  std::vector<Mode> out;
  for (const Mode& m : kModes)
    if (!m.segments) out.push_back(m);
  return out;
}

/// sim_options() for a simulated device of `mode`'s kind (segments or mappings).
inline SimBackend::Options mode_options(const Mode& mode, std::size_t capacity,
                                        std::uint64_t latency) {
  SimBackend::Options o = sim_options(capacity, latency);
  o.segments = mode.segments;
  return o;
}

/// A backend that forwards every call to a SimBackend: a test's decorator derives from it and
/// overrides only the calls it watches or gates.
class ForwardingBackend : public DeviceBackend {
 public:
  explicit ForwardingBackend(SimBackend& sim) : sim_(sim) {}
  std::size_t granularity() const override { return sim_.granularity(); }
  std::size_t capacity() const override { return sim_.capacity(); }
  DevicePtr reserve_address(std::size_t b) override { return sim_.reserve_address(b); }
  void release_address(DevicePtr va, std::size_t b) override { sim_.release_address(va, b); }
  PhysHandle create_physical(std::size_t b) override { return sim_.create_physical(b); }
  PhysHandle create_whole_physical(std::size_t b) override { return sim_.create_whole_physical(b); }
  void release_physical(PhysHandle c) override { sim_.release_physical(c); }
  void map(DevicePtr va, std::size_t b, PhysHandle c, std::size_t o) override {
    sim_.map(va, b, c, o);
  }
  void map_no_access(DevicePtr va, std::size_t b, PhysHandle c, std::size_t o) override {
    sim_.map_no_access(va, b, c, o);
  }
  void set_access(DevicePtr va, std::size_t b) override { sim_.set_access(va, b); }
  void unmap(DevicePtr va, std::size_t b) override { sim_.unmap(va, b); }
  EventId record_event(StreamId s) override { return sim_.record_event(s); }
  bool event_completed(EventId e) override { return sim_.event_completed(e); }
  void wait_event(EventId e) override { sim_.wait_event(e); }
  void release_event(EventId e) override { sim_.release_event(e); }
  bool supports_stream_waits() const override { return sim_.supports_stream_waits(); }
  bool stream_wait_event(StreamId s, EventId e) override { return sim_.stream_wait_event(s, e); }
  bool stream_capturing(StreamId s) override { return sim_.stream_capturing(s); }
  bool supports_mapping() const override { return sim_.supports_mapping(); }
  DevicePtr allocate_segment(std::size_t b, StreamId s) override {
    return sim_.allocate_segment(b, s);
  }
  void free_segment(DevicePtr p, std::size_t b) override { sim_.free_segment(p, b); }
  void trim() override { sim_.trim(); }

 protected:
  SimBackend& sim_;
};

}  // namespace cuarena::test
