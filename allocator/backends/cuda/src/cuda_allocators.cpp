#include "cuarena/cuda_allocators.hpp"

#include <string>

#include "cuarena/errors.hpp"

namespace cuarena {

Allocator& CudaAllocators::allocator(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw BackendError("cuarena: CUDA device " + std::to_string(device) + " out of range");
  if (Allocator* a = ready_[std::size_t(device)].load(std::memory_order_acquire)) return *a;
  std::lock_guard lock(create_mu_);
  PerDevice& d = devices_[std::size_t(device)];
  if (!d.allocator) {
    d.backend = make_cuda_backend(config_.upstream, device);
    d.allocator = std::make_unique<Allocator>(*d.backend, config_);
    ready_[std::size_t(device)].store(d.allocator.get(), std::memory_order_release);
    const int n = created_.fetch_add(1) + 1;
    only_device_.store(n == 1 ? device : -1, std::memory_order_release);
    only_.store(n == 1 ? d.allocator.get() : nullptr, std::memory_order_release);
  }
  return *d.allocator;
}

int CudaAllocators::device_of(const void* ptr) const {
  if (const int only = only_device_.load(std::memory_order_acquire); only >= 0) return only;
  for (int i = 0; i < kMaxDevices; ++i) {
    const Allocator* a = ready_[std::size_t(i)].load(std::memory_order_acquire);
    if (a != nullptr && a->owns(ptr)) return i;
  }
  return -1;
}

Allocator& CudaAllocators::owner(const void* ptr) {
  // One device in use: it is the owner or nobody is, and its deallocate() tells which.
  if (Allocator* a = only_.load(std::memory_order_acquire)) return *a;
  const int device = device_of(ptr);
  if (device < 0) {
    throw InvalidPointerError("cuarena: pointer " +
                              std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                              " was not allocated by any device's cuarena allocator");
  }
  return *ready_[std::size_t(device)].load(std::memory_order_acquire);
}

}  // namespace cuarena
