// cub::CachingDeviceAllocator for cuarena_gpu_bench (see cub_adapter.hpp). Host code only.
#include <cub/util_allocator.cuh>

#include "cub_adapter.hpp"

namespace cuarena::bench {

struct CubCachingAllocator::Impl {
  cub::CachingDeviceAllocator cub;  // default configuration; FreeAllCached() on destruction
};

CubCachingAllocator::CubCachingAllocator() : impl_(std::make_unique<Impl>()) {}

CubCachingAllocator::~CubCachingAllocator() = default;

cudaError_t CubCachingAllocator::allocate(void** ptr, std::size_t bytes, cudaStream_t stream) {
  return impl_->cub.DeviceAllocate(ptr, bytes, stream);
}

cudaError_t CubCachingAllocator::deallocate(void* ptr) { return impl_->cub.DeviceFree(ptr); }

std::size_t CubCachingAllocator::reserved_bytes(int device) const {
  cub::CachingDeviceAllocator& c = impl_->cub;
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.cached_bytes.find(device);
  return it == c.cached_bytes.end() ? 0 : it->second.free + it->second.live;
}

}  // namespace cuarena::bench
