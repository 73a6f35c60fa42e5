// Helpers shared by the core unit tests.
#pragma once

#include <cstdint>

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

}  // namespace cuarena::test
