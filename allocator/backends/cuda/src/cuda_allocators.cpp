#include "cuarena/cuda_allocators.hpp"

#include <string>

#include "cuarena/errors.hpp"

namespace cuarena {

Allocator& CudaAllocators::allocator(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw BackendError("cuarena: CUDA device " + std::to_string(device) + " out of range");
  std::lock_guard lock(mu_);
  PerDevice& d = devices_[std::size_t(device)];
  if (!d.allocator) {
    d.backend = make_cuda_backend(config_.upstream, device);
    d.allocator = std::make_unique<Allocator>(*d.backend, config_);
  }
  return *d.allocator;
}

int CudaAllocators::device_of(const void* ptr) const {
  std::lock_guard lock(mu_);
  for (int i = 0; i < kMaxDevices; ++i) {
    const PerDevice& d = devices_[std::size_t(i)];
    if (d.allocator && d.allocator->owns(ptr)) return i;
  }
  return -1;
}

Allocator& CudaAllocators::owner(const void* ptr) {
  const int device = device_of(ptr);
  if (device < 0) {
    throw InvalidPointerError("cuarena: pointer " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                              " was not allocated by any device's cuarena allocator");
  }
  return *devices_[std::size_t(device)].allocator;
}

}  // namespace cuarena
