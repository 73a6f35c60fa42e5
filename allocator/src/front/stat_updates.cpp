#include "front/stat_updates.hpp"

#include <cstdint>

namespace cuarena::detail {

void sync_inactive(Stats& stats, std::size_t free_blocks) {
  auto set = [](Stat& s, std::int64_t value) {
    if (value > s.current)
      s.increase(value - s.current);
    else if (value < s.current)
      s.decrease(s.current - value);
  };
  for (int p : {int(Pool::kAll), int(Pool::kSmall), int(Pool::kLarge)}) {
    set(stats.inactive_split_bytes[p],
        stats.reserved_bytes[p].current - stats.active_bytes[p].current);
  }
  set(stats.inactive_split[int(Pool::kAll)], std::int64_t(free_blocks));
  set(stats.inactive_split[int(Pool::kLarge)], std::int64_t(free_blocks));
}

void reset_peaks(Stats& stats) {
  for (StatArray* a : {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
                       &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                       &stats.inactive_split_bytes, &stats.requested_bytes}) {
    for (Stat& s : *a) s.reset_peak();
  }
}

}  // namespace cuarena::detail
