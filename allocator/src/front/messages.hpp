// The texts of the allocator's errors and invariant checks.
#pragma once

#include <cstddef>
#include <string>

#include "cuarena/config.hpp"
#include "cuarena/stats.hpp"
#include "cuarena/types.hpp"

namespace cuarena::detail {

/// `p` as "0x..." (lower-case hex).
std::string hex(DevicePtr p);

/// The out-of-memory message for a request of `bytes` on `stream`: what was asked, the device
/// `capacity` and `limit` (bytes), and what `stats` (statistics folded) says cuarena holds.
std::string out_of_memory_message(std::size_t bytes, StreamId stream, std::size_t capacity,
                                  std::size_t limit, const Config& config, const Stats& stats);

}  // namespace cuarena::detail
