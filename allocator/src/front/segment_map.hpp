// The segment map of Allocator::segments(): allocations laid over the reserved runs.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "cuarena/allocator.hpp"

namespace cuarena::detail {

/// One SegmentInfo per run of `runs` ([addr, addr + size) mapped, bytes), in address order,
/// each listing the pieces of `used` (live and pending-free allocations) that lie wholly inside
/// it and the inactive gaps between them. The stream of a segment is its first piece's. Sorts
/// both vectors; a piece inside no run is left out.
std::vector<Allocator::SegmentInfo> segment_map(
    std::vector<std::pair<DevicePtr, std::size_t>>& runs,
    std::vector<Allocator::SegmentInfo::Piece>& used);

}  // namespace cuarena::detail
