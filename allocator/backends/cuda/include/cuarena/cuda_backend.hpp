// CudaBackend: what every CUDA upstream adds to DeviceBackend, and the factory that picks one by
// `Config::upstream`.
//
//   vmm    (CudaVmmBackend)   cuMemCreate/cuMemMap: the core steals and aliases granules.
//   async  (CudaAsyncBackend) segments from a per-device cudaMemPool via cudaMallocAsync; the
//                             pool's release threshold is UINT64_MAX and release_cached() trims
//                             it with cudaMemPoolTrimTo(pool, 0).
//   malloc (CudaMallocBackend) segments from cudaMalloc, for drivers or sandboxes without VMM.
//
// Thread semantics: as DeviceBackend. Errors: BackendError naming the failed call.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "cuarena/config.hpp"
#include "cuarena/device_backend.hpp"

namespace cuarena {

class CudaBackend : public DeviceBackend {
 public:
  /// The CUDA device ordinal served.
  virtual int device() const = 0;
  /// Driver/runtime memory calls made so far (create/release/map/unmap/set-access, or
  /// segment allocations and frees), for cost accounting.
  virtual std::size_t driver_calls() const = 0;
  /// Host wall time spent in those calls, and in event records and queries, in microseconds,
  /// by call ("cuMemMap", "cudaEventRecord", ...).
  virtual std::map<std::string, double> driver_us() const = 0;
};

/// The backend for `upstream` on CUDA device `device`, limited to `capacity` bytes of device
/// memory (0: the device's total memory). Throws BackendError when the device does not exist
/// or lacks what the upstream needs (VMM support for vmm, memory pools for async).
std::unique_ptr<CudaBackend> make_cuda_backend(Upstream upstream, int device,
                                               std::size_t capacity = 0);

}  // namespace cuarena
