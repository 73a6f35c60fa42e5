// The segment upstreams (DeviceBackend::supports_mapping() == false): the core splits and caches
// whole segments and never maps. For drivers, sandboxes or tools (e.g. IPC, some profilers) where
// CUDA's virtual memory management is unavailable or unwanted.
//
//   CudaMallocBackend: cudaMalloc/cudaFree. cudaFree synchronizes the device, which the core only
//     causes on its out-of-memory path and in release_cached().
//   CudaAsyncBackend: cudaMallocFromPoolAsync/cudaFreeAsync on a private cudaMemPool of the
//     device, release threshold UINT64_MAX (the pool keeps freed memory for the next segment),
//     trimmed to zero by trim() (cudaMemPoolTrimTo), which is its defragmentation step. A
//     segment is allocated on the requesting stream; one is freed on the device's legacy default
//     stream, after the core has seen every use of it complete.
//
// Errors: BackendError naming the call; out of memory is returned as 0 (after clearing CUDA's
// sticky-free error state). Thread semantics: as DeviceBackend; calls switch to the backend's
// device and restore the caller's.
#pragma once

#include <cstddef>
#include <memory>

#include "cuarena/cuda_backend.hpp"

namespace cuarena {

class CudaSegmentBackend : public CudaBackend {
 public:
  ~CudaSegmentBackend() override;

  std::size_t granularity() const override { return kGranule; }
  std::size_t capacity() const override;
  int device() const override;
  std::size_t driver_calls() const override;
  std::map<std::string, double> driver_us() const override;
  bool supports_mapping() const override { return false; }

  EventId record_event(StreamId stream) override;
  bool event_completed(EventId event) override;
  void wait_event(EventId event) override;
  void release_event(EventId event) override;
  bool supports_stream_waits() const override { return true; }
  bool stream_wait_event(StreamId stream, EventId event) override;
  bool stream_capturing(StreamId stream) override;

  // A segment backend has no address space or physical handles: these throw std::logic_error.
  DevicePtr reserve_address(std::size_t bytes) override;
  void release_address(DevicePtr va, std::size_t bytes) override;
  PhysHandle create_physical(std::size_t bytes) override;
  void release_physical(PhysHandle chunk) override;
  void map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) override;
  void unmap(DevicePtr va, std::size_t bytes) override;

  /// Segment sizes are multiples of this (the driver's 2 MiB large-page size).
  static constexpr std::size_t kGranule = std::size_t{2} << 20;

 protected:
  CudaSegmentBackend(int device, std::size_t capacity);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CudaMallocBackend final : public CudaSegmentBackend {
 public:
  /// Serves `device`, holding at most `capacity` bytes (0: the device's total memory).
  explicit CudaMallocBackend(int device, std::size_t capacity = 0);
  DevicePtr allocate_segment(std::size_t bytes, StreamId stream) override;
  void free_segment(DevicePtr ptr, std::size_t bytes) override;
};

class CudaAsyncBackend final : public CudaSegmentBackend {
 public:
  /// Serves `device` from a new private memory pool. Throws BackendError when the device does
  /// not support memory pools.
  explicit CudaAsyncBackend(int device, std::size_t capacity = 0);
  ~CudaAsyncBackend() override;
  DevicePtr allocate_segment(std::size_t bytes, StreamId stream) override;
  void free_segment(DevicePtr ptr, std::size_t bytes) override;
  void trim() override;
};

}  // namespace cuarena
