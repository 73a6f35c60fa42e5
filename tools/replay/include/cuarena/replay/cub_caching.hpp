// CUB's CachingDeviceAllocator (<cub/util_allocator.cuh>, from the CUDA toolkit's CCCL) behind a
// plain C++17 interface. The CUB header is compiled by nvcc, in cub_caching.cu (nvcc finds the
// toolkit's own CCCL headers wherever the toolkit keeps them), so C++20 host code never includes
// it. Used by the `cub` row of GPU replay and by cuarena_gpu_bench (through make_cub()).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace cuarena::replay {

/// CUB's default cache limit: (8^7 * 3) - 1 = 6,291,455 free bytes per device.
inline constexpr std::size_t kCubDefaultMaxCachedBytes = (std::size_t{1} << 21) * 3 - 1;

/// One cub::CachingDeviceAllocator with CUB's default bins (bin_growth 8, bins 8^3 = 512 B to
/// 8^7 = 2 MiB; larger requests are cudaMalloc'd exactly and cudaFree'd on release, never
/// cached). Thread-safe (CUB locks its own mutex). Calls act on the calling thread's current
/// device.
class CubCachingAllocator {
 public:
  /// Keeps at most `max_cached_bytes` free bytes cached per device (SIZE_MAX: no limit).
  explicit CubCachingAllocator(std::size_t max_cached_bytes);
  /// Frees every cached block (CUB's FreeAllCached). Blocks still live are leaked.
  ~CubCachingAllocator();
  CubCachingAllocator(const CubCachingAllocator&) = delete;
  CubCachingAllocator& operator=(const CubCachingAllocator&) = delete;

  /// CUB's DeviceAllocate(ptr, bytes, stream). cudaErrorMemoryAllocation when out of memory.
  cudaError_t allocate(void** ptr, std::size_t bytes, cudaStream_t stream);
  /// CUB's DeviceFree(ptr).
  cudaError_t deallocate(void* ptr);
  /// CUB's FreeAllCached(): cudaFree's every cached (free) block on every device.
  cudaError_t release_cached();
  /// Bytes CUB holds on `device` by its own counters: cached (free) plus live. Blocks above the
  /// largest bin count at their requested size.
  std::size_t reserved_bytes(int device) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuarena::replay
