// Replaying a trace with real device memory: every allocator sees the same operations on the
// same CUDA streams (one stream created per trace stream), timed per call on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "replay.hpp"
#include "trace.hpp"

namespace cuarena::replay {

/// An allocator under test. Calls come from one thread; `stream` is a cudaStream_t.
class GpuAllocator {
 public:
  virtual ~GpuAllocator() = default;
  virtual std::string name() const = 0;
  /// Returns nullptr when out of memory (and must leave the CUDA error state clean).
  virtual void* allocate(std::size_t bytes, void* stream) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, void* stream) = 0;
  /// Physical bytes held now, by the allocator's own accounting.
  virtual std::size_t reserved_bytes() = 0;
  /// Allocator-specific counters for the JSON report.
  virtual std::map<std::string, std::int64_t> counters() { return {}; }
};

/// Why GPU replay cannot run here (no driver, no device, bad ordinal); empty when it can.
std::string gpu_unavailable_reason(int device);

/// cuarena over CudaVmmBackend on `device`, configured by `config`.
std::unique_ptr<GpuAllocator> make_cuarena_gpu(int device, const Config& config);
/// cudaMalloc / cudaFree, one call per block.
std::unique_ptr<GpuAllocator> make_cuda_malloc(int device);
/// cudaMallocFromPoolAsync / cudaFreeAsync on a private pool with no release threshold.
std::unique_ptr<GpuAllocator> make_cuda_async(int device);

struct GpuReplayOptions {
  bool verify = false;   ///< tag every block with a kernel and check the tag before its free
  int device = 0;
};

/// Replays one device's events. Fills peak_reserved (own accounting), latency percentiles
/// (microseconds) and, in counters, the cudaMemGetInfo cross-check.
Result replay_gpu(const std::vector<Event>& events, GpuAllocator& allocator,
                  const GpuReplayOptions& options);

}  // namespace cuarena::replay
