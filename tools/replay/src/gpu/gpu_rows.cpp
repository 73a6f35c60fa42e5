// The in-process GPU rows (every one but PyTorch's): the allocator built by make_gpu_allocator,
// replayed by replay_gpu, and with --min-capacity held to each probed limit.
#include <iostream>

#include "cuarena/errors.hpp"
#include "cuarena/replay/allocator_registry.hpp"
#include "cuarena/replay/gpu_capacity.hpp"
#include "cuarena/replay/gpu_replay.hpp"

namespace cuarena::replay {

namespace {

// --min-capacity for an in-process GPU row: each probe builds the allocator held to the limit.
std::optional<std::uint64_t> gpu_row_min_capacity(const std::string& allocator, const Result& r,
                                                  const RowContext& c) {
  const int device = c.args.device;
  if (r.ooms > 0) {
    std::cerr << "cuarena replay: " << c.path << ": " << allocator
              << ": no min capacity: it ran out of memory even without a limit\n";
    return std::nullopt;
  }
  auto fits = [&](std::uint64_t limit) {
    std::unique_ptr<GpuAllocator> held;
    try {
      held = make_gpu_allocator(allocator, device, c.sim.config, limit);
    } catch (const OutOfMemoryError&) {  // the limit cannot even be set up (rmm-arena)
      return false;
    }
    return replays_within(c.events, *held, device, c.args.gpu_lag);
  };
  auto found = gpu_min_capacity(c.events, device, r.peak_reserved_bytes, fits);
  if (!found)
    std::cerr << "cuarena replay: " << c.path << ": " << allocator
              << ": no min capacity: no limit up to the device's memory replays it\n";
  return found;
}

}  // namespace

std::optional<Result> gpu_row(const std::string& allocator, const RowContext& c) {
  GpuReplayOptions options;
  options.verify = c.args.verify;
  options.device = c.args.device;
  options.series = !c.args.report.empty() || c.args.series;
  options.gpu_lag = c.args.gpu_lag;
  Result r;
  {  // destroyed before the capacity search, so its memory is back on the device
    std::unique_ptr<GpuAllocator> impl = make_gpu_allocator(allocator, c.args.device, c.sim.config);
    r = replay_gpu(c.events, *impl, options);
  }
  if (c.args.min_capacity) r.min_capacity_bytes = gpu_row_min_capacity(allocator, r, c);
  return r;
}

std::string cuda_unavailable_reason(int device) { return gpu_unavailable_reason(device); }

std::string rmm_rows_unavailable() { return rmm_unavailable_reason(); }

}  // namespace cuarena::replay
