// The kernel for `--gpu-lag`: a short busy wait on a stream, so that the device falls behind the
// host as it does under a real job's kernels (a replay alone launches none, and the device then
// finishes every free before the allocator looks again).
#pragma once

#include <cstdint>

namespace cuarena::replay {

/// Keeps `stream` (a cudaStream_t) busy for about `ns` nanoseconds of device time (one thread
/// reading the global timer). Asynchronous; launch errors surface at the next CUDA check.
void launch_busy(std::uint64_t ns, void* stream);

}  // namespace cuarena::replay
