// State shared by the parts of one Allocator: the backend, the statistics, and the limits.
#pragma once

#include <cstddef>

#include "cuarena/config.hpp"
#include "cuarena/device_backend.hpp"
#include "cuarena/stats.hpp"

namespace cuarena::detail {

struct Context {
  DeviceBackend& backend;
  const Config& config;
  Stats& stats;
  std::size_t granule;      ///< backend.granularity()
  std::size_t limit;        ///< most physical bytes that may be held at once
  std::size_t soft_limit;   ///< above this, reuse cached granules before creating new ones

  void add_reserved(Pool pool, std::int64_t bytes) {
    auto& r = stats.reserved_bytes;
    if (bytes >= 0) {
      r[int(Pool::kAll)].increase(bytes);
      r[int(pool)].increase(bytes);
    } else {
      r[int(Pool::kAll)].decrease(-bytes);
      r[int(pool)].decrease(-bytes);
    }
  }
  std::size_t reserved() const {
    return std::size_t(stats.reserved_bytes[int(Pool::kAll)].current);
  }
};

}  // namespace cuarena::detail
