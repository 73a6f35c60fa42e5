// Updates of the allocator's statistics that walk them whole: the inactive ones derived from
// the others, and the peaks reset.
#pragma once

#include <cstddef>

#include "cuarena/stats.hpp"

namespace cuarena::detail {

/// Sets inactive_split_bytes to reserved_bytes - active_bytes in every pool, and the large
/// pool's (and all's) inactive_split to `free_blocks`, the pool's free block count; peaks
/// follow as increase()/decrease() move them.
void sync_inactive(Stats& stats, std::size_t free_blocks);

/// Resets the peak of every Stat to its current value.
void reset_peaks(Stats& stats);

}  // namespace cuarena::detail
