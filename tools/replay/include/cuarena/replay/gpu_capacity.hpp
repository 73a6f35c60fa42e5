// `--min-capacity` on a GPU: holding an allocator to a capacity limit, and the binary search for
// the smallest limit under which a trace replays without out-of-memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cuarena/replay/gpu_replay.hpp"
#include "cuarena/replay/trace.hpp"

namespace cuarena::replay {

/// Resolution of the GPU capacity search, in bytes (one 2 MiB granule).
inline constexpr std::uint64_t kCapacityStep = std::uint64_t{2} << 20;

/// Holds `inner` to at most `limit` reserved bytes, for allocators without a limit of their own
/// (cuda-malloc, cuda-async, cub, torch-async). An allocation after which inner.reserved_bytes()
/// exceeds `limit` is freed again, inner.release_cache() is called and the allocation retried
/// once; if reserved still exceeds `limit`, it is freed, the cache released again, and nullptr
/// returned (out of memory). The check follows the call, so the device briefly holds one
/// allocation more than `limit`.
std::unique_ptr<GpuAllocator> limit_reserved(std::unique_ptr<GpuAllocator> inner,
                                             std::uint64_t limit);
/// As above, without owning `inner`, which must outlive the result.
std::unique_ptr<GpuAllocator> limit_reserved(GpuAllocator& inner, std::uint64_t limit);

/// True when `events` replay through `allocator` on `device` without an out-of-memory failure,
/// the device kept `gpu_lag` events behind (GpuReplayOptions::gpu_lag). Stops at the first one;
/// no verification kernels. Throws as replay_gpu().
bool replays_within(const std::vector<Event>& events, GpuAllocator& allocator, int device,
                    std::uint64_t gpu_lag = 0);

/// search_min_capacity() in kCapacityStep steps for one GPU row: floor = the events' peak requested
/// bytes, ceiling = `device`'s total memory. `fits(limit)` builds the allocator held to `limit` and
/// calls replays_within().
std::optional<std::uint64_t> gpu_min_capacity(const std::vector<Event>& events, int device,
                                              std::uint64_t known_good,
                                              const std::function<bool(std::uint64_t)>& fits);

}  // namespace cuarena::replay
