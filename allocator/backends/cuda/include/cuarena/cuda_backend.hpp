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
#include <vector>

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

  /// One mapping of an exported range: `bytes` at `offset` into the range are `handle_offset`
  /// bytes into the physical allocation that file descriptor `fd` (of this process, owned by the
  /// backend until the memory is released) exports.
  struct ExportPiece {
    std::size_t offset = 0;
    std::size_t bytes = 0;
    std::size_t handle_offset = 0;
    int fd = -1;
  };
  /// CUDA IPC: the physical memory mapped at [va, va+bytes) (granule multiples, all mapped), as
  /// file descriptors another process can import (cuda_ipc.hpp). Throws BackendError when this
  /// upstream's memory cannot be exported (the default).
  virtual std::vector<ExportPiece> export_range(DevicePtr va, std::size_t bytes);
};

/// The backend for `upstream` on CUDA device `device`, limited to `capacity` bytes of device
/// memory (0: the device's total memory). Throws BackendError when the device does not exist
/// or lacks what the upstream needs (VMM support for vmm, memory pools for async).
std::unique_ptr<CudaBackend> make_cuda_backend(Upstream upstream, int device,
                                               std::size_t capacity = 0);

}  // namespace cuarena
