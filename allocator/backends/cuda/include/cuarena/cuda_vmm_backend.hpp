// CudaVmmBackend: DeviceBackend over CUDA's virtual memory management on one device.
//
// A physical chunk of n granules is n cuMemCreate handles of one granule each (pinned device
// memory, granularity from cuMemGetAllocationGranularity): cuMemMap maps only whole handles and
// cuMemUnmap unmaps only whole mappings, while the core maps, aliases and unmaps single
// granules. A whole chunk (create_whole_physical) is one handle, which the core maps whole. Virtual
// ranges come from cuMemAddressReserve; one cuMemSetAccess covers each mapped run. It uses the
// driver API alone (no CUDA runtime), with entry points resolved at run time (driver_api.hpp):
// nothing links libcuda or libcudart, so the LD_PRELOAD shim can build on it and never recurses
// into its own hooks. Events are CUevents with timing disabled, pooled and reused; a StreamId is a
// CUstream (= cudaStream_t) cast to an integer.
//
// Errors: a failed driver call throws BackendError naming the call, its arguments and the
// driver's message; out-of-memory from cuMemCreate is reported as 0 (the core then
// defragments or throws OutOfMemoryError). Thread semantics: as DeviceBackend (the Allocator
// serialises calls); calls switch to this backend's device and restore the caller's.
#pragma once

#include <cstddef>
#include <memory>

#include "cuarena/cuda_backend.hpp"

namespace cuarena {

class CudaVmmBackend final : public CudaBackend {
 public:
  /// Serves CUDA device `device`. `capacity` bytes (0: the device's total memory). `context` is
  /// the CUcontext whose streams events are recorded on and whose calls are made in (null: the
  /// device's primary context, the runtime's). Throws BackendError when the device or driver
  /// lacks VMM support.
  explicit CudaVmmBackend(int device, std::size_t capacity = 0, void* context = nullptr);
  ~CudaVmmBackend() override;

  std::size_t granularity() const override;
  std::size_t capacity() const override;
  DevicePtr reserve_address(std::size_t bytes) override;
  void release_address(DevicePtr va, std::size_t bytes) override;
  PhysHandle create_physical(std::size_t bytes) override;
  /// One cuMemCreate handle for all `bytes`; mapped and unmapped with one call each.
  PhysHandle create_whole_physical(std::size_t bytes) override;
  void release_physical(PhysHandle chunk) override;
  void map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) override;
  void map_no_access(DevicePtr va, std::size_t bytes, PhysHandle chunk,
                     std::size_t offset) override;
  /// One cuMemSetAccess over the range (it may span several cuMemMap mappings).
  void set_access(DevicePtr va, std::size_t bytes) override;
  void unmap(DevicePtr va, std::size_t bytes) override;
  EventId record_event(StreamId stream) override;
  bool event_completed(EventId event) override;
  void wait_event(EventId event) override;
  void release_event(EventId event) override;
  bool supports_stream_waits() const override { return true; }
  bool stream_wait_event(StreamId stream, EventId event) override;
  bool stream_capturing(StreamId stream) override;

  int device() const override;
  /// Driver calls made so far (cuMemCreate/Release/Map/Unmap/SetAccess), for cost accounting.
  std::size_t driver_calls() const override;
  std::map<std::string, double> driver_us() const override;
  /// Physical memory is created exportable as POSIX file descriptors where the device supports
  /// it (checked at construction); each handle is exported once, on first request.
  std::vector<ExportPiece> export_range(DevicePtr va, std::size_t bytes) override;
  /// Whether physical memory is created GPUDirect RDMA capable (allocFlags.gpuDirectRDMACapable),
  /// as it is where the device supports it with VMM (checked at construction).
  bool rdma_capable() const;

 private:
  void map_runs(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset, bool access);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuarena
