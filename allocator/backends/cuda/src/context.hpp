// Devices and contexts through the driver API (no runtime): what a backend needs to run its
// calls in the right context, whoever calls it.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace cuarena::cuda {

/// The primary context of device ordinal `device` (the one the CUDA runtime uses), retained once
/// per process and kept. Initialises the driver on first use. Throws BackendError for a bad
/// ordinal or a driver that cannot start.
CUcontext primary_context(int device);

/// Makes `context` (null: the primary context of `device`) current for a scope and restores the
/// caller's current context (possibly none) after. A no-op when it is current already.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, CUcontext context = nullptr);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

/// cuDeviceGetAttribute for device ordinal `device`. Throws BackendError on failure.
int device_attribute(CUdevice_attribute attribute, int device);

/// Free and total bytes of device `device` (cuMemGetInfo in `context`; null: its primary context).
void mem_info(int device, std::size_t& free_bytes, std::size_t& total_bytes,
              CUcontext context = nullptr);

}  // namespace cuarena::cuda
