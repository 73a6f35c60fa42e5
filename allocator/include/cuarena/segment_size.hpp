// How big a segment a request gets, PyTorch's rule: small requests share one small segment,
// mid-size ones a larger shared segment, large ones a segment of their own size.
#pragma once

#include <cstddef>

#include "cuarena/types.hpp"

namespace cuarena {

/// The sizes the rule uses, in bytes. The defaults are PyTorch's (CUDACachingAllocator.cpp):
/// kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer and kRoundLarge.
struct SegmentSizeRule {
  std::size_t small_request = 1 * MiB;    ///< requests up to this get `small_segment` (kSmallSize)
  std::size_t small_segment = 2 * MiB;    ///< kSmallBuffer
  std::size_t medium_request = 10 * MiB;  ///< requests below this get `medium_segment`
  std::size_t medium_segment = 20 * MiB;  ///< kLargeBuffer
  std::size_t granule = 2 * MiB;          ///< larger requests: their size rounded up to this
};

/// The segment for a request of `size` bytes (already rounded as the caller rounds requests):
/// `small_segment` up to and including `small_request`, `medium_segment` below `medium_request`,
/// else `size` rounded up to `granule`. Mirrors get_allocation_size() of PyTorch's
/// c10/cuda/CUDACachingAllocator.cpp. Precondition: rule.granule > 0 (callers check their rule
/// where they take it from a user). Fits `size` when small_segment >= small_request and
/// medium_segment >= medium_request, as PyTorch's does.
constexpr std::size_t segment_size(std::size_t size, const SegmentSizeRule& rule = {}) {
  if (size <= rule.small_request) return rule.small_segment;
  if (size < rule.medium_request) return rule.medium_segment;
  return round_up(size, rule.granule);
}

}  // namespace cuarena
