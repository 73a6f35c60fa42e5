// CudaAllocators: one cuarena Allocator per CUDA device, created on first use, each over its own
// backend of the configured upstream (make_cuda_backend). A pointer is always returned to the
// device that allocated it, whichever device is current when it is freed.
//
// Thread semantics: every member is safe to call concurrently; after a device's first use,
// finding its allocator takes no lock (so threads scale as far as Allocator does), and with a
// single device in use a free goes straight to it. Errors: as Allocator;
// InvalidPointerError for a pointer no device's allocator owns; BackendError for a device that
// does not exist or lacks what the upstream needs.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include "cuarena/allocator.hpp"
#include "cuarena/cuda_backend.hpp"

namespace cuarena {

class CudaAllocators {
 public:
  static constexpr int kMaxDevices = 64;

  explicit CudaAllocators(Config config = Config::from_env()) : config_(std::move(config)) {}

  /// `bytes` on CUDA device `device`, stream-ordered on `stream` (a cudaStream_t of that device).
  void* allocate(std::size_t bytes, int device, StreamId stream) {
    return allocator(device).allocate(bytes, stream);
  }
  /// Frees on the owning device's allocator, whatever the current device.
  void deallocate(void* ptr) {
    if (ptr != nullptr) owner(ptr).deallocate(ptr);
  }
  void record_stream(void* ptr, StreamId stream) { owner(ptr).record_stream(ptr, stream); }

  /// The allocator of `device`, created on first use. Throws BackendError for a bad ordinal.
  Allocator& allocator(int device);
  /// The device whose allocator owns `ptr`, or -1. With one device in use, that device
  /// without a look (whether it owns `ptr` is then for its allocator to say).
  int device_of(const void* ptr) const;
  /// The backend of `device`, created on first use like allocator().
  CudaBackend& backend(int device) {
    allocator(device);
    return *devices_[std::size_t(device)].backend;
  }

 private:
  struct PerDevice {
    std::unique_ptr<CudaBackend> backend;
    std::unique_ptr<Allocator> allocator;
  };
  Allocator& owner(const void* ptr);

  Config config_;
  std::mutex create_mu_;                        // guards creation; each Allocator locks itself
  std::array<PerDevice, kMaxDevices> devices_;  // written under create_mu_ only
  std::array<std::atomic<Allocator*>, kMaxDevices> ready_{};  // published once created
  std::atomic<int> created_{0};
  std::atomic<Allocator*> only_{nullptr};  // the allocator while exactly one device has one
  std::atomic<int> only_device_{-1};       // its device
};

}  // namespace cuarena
