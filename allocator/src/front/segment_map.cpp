#include "front/segment_map.hpp"

#include <algorithm>

namespace cuarena::detail {

std::vector<Allocator::SegmentInfo> segment_map(
    std::vector<std::pair<DevicePtr, std::size_t>>& runs,
    std::vector<Allocator::SegmentInfo::Piece>& used) {
  using SegmentInfo = Allocator::SegmentInfo;
  using State = SegmentInfo::State;
  std::sort(used.begin(), used.end(), [](const auto& a, const auto& b) { return a.addr < b.addr; });
  std::sort(runs.begin(), runs.end());
  std::vector<SegmentInfo> out;
  auto next = used.begin();
  for (const auto& [addr, size] : runs) {
    SegmentInfo seg{addr, size, 0, {}};
    DevicePtr pos = addr;
    next = std::lower_bound(next, used.end(), addr,
                            [](const auto& piece, DevicePtr a) { return piece.addr < a; });
    for (; next != used.end() && next->addr + next->size <= addr + size; ++next) {
      if (next->addr > pos) seg.blocks.push_back({pos, next->addr - pos, 0, State::kInactive, 0});
      if (seg.stream == 0) seg.stream = next->stream;
      seg.blocks.push_back(*next);
      pos = next->addr + next->size;
    }
    if (pos < addr + size) seg.blocks.push_back({pos, addr + size - pos, 0, State::kInactive, 0});
    out.push_back(std::move(seg));
  }
  return out;
}

}  // namespace cuarena::detail
