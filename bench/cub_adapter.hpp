// CUB's CachingDeviceAllocator (<cub/util_allocator.cuh>, from the CUDA toolkit's CCCL) behind a
// plain C++17 interface, for cuarena_gpu_bench. The CUB header is compiled by nvcc, in
// cub_adapter.cu (nvcc finds the toolkit's own CCCL headers wherever the toolkit keeps them), so
// gpu_bench.cpp (C++20 host code) never includes it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace cuarena::bench {

/// One cub::CachingDeviceAllocator with CUB's default configuration (bin_growth 8, bins 512 B to
/// 2 MiB, at most 6,291,455 bytes cached per device: larger requests are cudaMalloc'd exactly and
/// cudaFree'd on release). Thread-safe (CUB locks its own mutex). Calls act on the calling
/// thread's current device.
class CubCachingAllocator {
 public:
  CubCachingAllocator();
  /// Frees every cached block (CUB's FreeAllCached). Blocks still live are leaked.
  ~CubCachingAllocator();
  CubCachingAllocator(const CubCachingAllocator&) = delete;
  CubCachingAllocator& operator=(const CubCachingAllocator&) = delete;

  /// CUB's DeviceAllocate(ptr, bytes, stream). cudaErrorMemoryAllocation when out of memory.
  cudaError_t allocate(void** ptr, std::size_t bytes, cudaStream_t stream);
  /// CUB's DeviceFree(ptr).
  cudaError_t deallocate(void* ptr);
  /// Bytes CUB holds on `device`: cached (free) plus live.
  std::size_t reserved_bytes(int device) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuarena::bench
