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

}  // namespace cuarena::test
