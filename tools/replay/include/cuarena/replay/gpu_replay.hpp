// Replaying a trace with real device memory: every allocator sees the same operations on the
// same CUDA streams (one stream created per trace stream), timed per call on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"

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
  /// Hands cached (free) memory back to the device where the allocator has a call for it
  /// (cudaMemPoolTrimTo, CUB's FreeAllCached, PyTorch's emptyCache); a no-op otherwise.
  virtual void release_cache() {}
};

/// Why GPU replay cannot run here (no driver, no device, bad ordinal); empty when it can.
std::string gpu_unavailable_reason(int device);

/// cuarena on `device` over the CUDA backend of `config.upstream` (make_cuda_backend), holding
/// at most `capacity` bytes of device memory (0: the device's total), reported as `name`.
/// Throws BackendError when the device lacks what the upstream needs.
std::unique_ptr<GpuAllocator> make_cuarena_gpu(int device, const Config& config,
                                               std::size_t capacity = 0,
                                               const std::string& name = "cuarena");
/// cudaMalloc / cudaFree, one call per block.
std::unique_ptr<GpuAllocator> make_cuda_malloc(int device);
/// cudaMallocFromPoolAsync / cudaFreeAsync on a private pool with no release threshold.
std::unique_ptr<GpuAllocator> make_cuda_async(int device);
/// cub::CachingDeviceAllocator (cub_caching.hpp) keeping at most `max_cached_bytes` free bytes
/// cached (SIZE_MAX: no limit; kCubDefaultMaxCachedBytes: CUB's default).
std::unique_ptr<GpuAllocator> make_cub(int device, std::size_t max_cached_bytes);

/// Why the rmm-pool / rmm-arena rows cannot run in this build ("RMM not found at build
/// time ..."); empty when they can.
std::string rmm_unavailable_reason();
/// RMM's pool ("rmm-pool") or arena ("rmm-arena") over cudaMalloc on `device` (see
/// rmm_allocators.cpp for the settings). `limit` > 0 caps the bytes taken from cudaMalloc
/// (the arena's size): RMM then sees out-of-memory from its upstream, as on a device that small.
/// Throws std::runtime_error when RMM is missing or fails, OutOfMemoryError when the arena's
/// up-front reservation of `limit` bytes fails.
std::unique_ptr<GpuAllocator> make_rmm(const std::string& name, int device,
                                       std::uint64_t limit = 0);

/// The in-process allocator called `name` on `device` (every GPU row but PyTorch's, which run in
/// their own process): cuarena (upstream from `config`), cuarena-async and cuarena-malloc
/// (upstream forced), cuda-malloc, cuda-async, cub (no cache limit), rmm-pool, rmm-arena.
/// `limit` > 0 holds it to at most `limit` reserved bytes (--min-capacity): cuarena through its
/// backend's capacity, RMM through its upstream (make_rmm), the others through limit_reserved().
/// Throws ConfigError for an unknown name, as make_rmm and make_cuarena_gpu otherwise.
std::unique_ptr<GpuAllocator> make_gpu_allocator(const std::string& name, int device,
                                                 const Config& config, std::uint64_t limit = 0);

struct GpuReplayOptions {
  bool verify = false;  ///< tag every block with a kernel and check the tag before its free
  int device = 0;
  bool stop_at_oom = false;  ///< end at the first out-of-memory (the capacity search)
  /// Fill Result::series: the allocator's reserved bytes read after every event (after frees
  /// too, outside the timed calls; the peak is read after allocations only, as without it).
  bool series = false;
  /// Keep the device about this many trace events behind the host, as sim_event_latency does
  /// on the simulator (0 or 1: no kernels, and the device keeps up). After each event a busy
  /// kernel of kLagKernelNs runs on the event's stream and an event is recorded there; before
  /// event i the host waits for the one recorded after event i - gpu_lag. Outside the timed
  /// calls, but the replay takes about kLagKernelNs per event longer.
  std::uint64_t gpu_lag = 0;
};

/// Device time of one --gpu-lag kernel: longer than the host's work per event (a few
/// microseconds, but for driver calls), so the device stays behind.
constexpr std::uint64_t kLagKernelNs = 20'000;

/// The largest --gpu-lag (one CUDA event per event of lag is kept).
constexpr std::uint64_t kMaxGpuLag = 65'536;

/// Replays one device's events. Fills peak_reserved (own accounting), latency percentiles
/// (microseconds) and, in counters, the cudaMemGetInfo cross-check. Throws
/// std::invalid_argument when options.gpu_lag is above kMaxGpuLag.
Result replay_gpu(const std::vector<Event>& events, GpuAllocator& allocator,
                  const GpuReplayOptions& options);

}  // namespace cuarena::replay
