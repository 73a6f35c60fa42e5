// cub::CachingDeviceAllocator behind CubCachingAllocator (see cub_caching.hpp). Host code only.
#include <cub/util_allocator.cuh>

#include "cuarena/replay/cub_caching.hpp"

namespace cuarena::replay {

struct CubCachingAllocator::Impl {
  explicit Impl(std::size_t max_cached_bytes)
      : cub(/*bin_growth=*/8, /*min_bin=*/3, /*max_bin=*/7, max_cached_bytes,
            /*skip_cleanup=*/false) {}
  cub::CachingDeviceAllocator cub;  // FreeAllCached() on destruction
};

CubCachingAllocator::CubCachingAllocator(std::size_t max_cached_bytes)
    : impl_(std::make_unique<Impl>(max_cached_bytes)) {}

CubCachingAllocator::~CubCachingAllocator() = default;

cudaError_t CubCachingAllocator::allocate(void** ptr, std::size_t bytes, cudaStream_t stream) {
  return impl_->cub.DeviceAllocate(ptr, bytes, stream);
}

cudaError_t CubCachingAllocator::deallocate(void* ptr) { return impl_->cub.DeviceFree(ptr); }

cudaError_t CubCachingAllocator::release_cached() { return impl_->cub.FreeAllCached(); }

std::size_t CubCachingAllocator::reserved_bytes(int device) const {
  cub::CachingDeviceAllocator& c = impl_->cub;
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.cached_bytes.find(device);
  return it == c.cached_bytes.end() ? 0 : it->second.free + it->second.live;
}

}  // namespace cuarena::replay
