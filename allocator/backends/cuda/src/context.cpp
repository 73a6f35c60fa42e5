#include "context.hpp"

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "cuarena/driver_api.hpp"
#include "cuarena/errors.hpp"

namespace cuarena::cuda {

namespace {
constexpr int kMaxDevices = 64;
std::array<std::atomic<CUcontext>, kMaxDevices> g_primary{};
std::mutex g_primary_mu;

CUdevice device_handle(int device) {
  const DriverApi& api = DriverApi::get();
  check(api.init(0), "cuInit");
  CUdevice dev = 0;
  check(api.device_get(&dev, device), ("cuDeviceGet(" + std::to_string(device) + ")").c_str());
  return dev;
}
}  // namespace

CUcontext primary_context(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw BackendError("cuarena: CUDA device " + std::to_string(device) + " out of range");
  if (CUcontext c = g_primary[std::size_t(device)].load(std::memory_order_acquire)) return c;
  std::lock_guard lock(g_primary_mu);
  if (CUcontext c = g_primary[std::size_t(device)].load(std::memory_order_relaxed)) return c;
  CUcontext ctx = nullptr;
  check(DriverApi::get().primary_ctx_retain(&ctx, device_handle(device)),
        "cuDevicePrimaryCtxRetain");
  g_primary[std::size_t(device)].store(ctx, std::memory_order_release);
  return ctx;
}

DeviceGuard::DeviceGuard(int device, CUcontext context) {
  const DriverApi& api = DriverApi::get();
  const CUcontext want = context ? context : primary_context(device);
  check(api.ctx_get_current(&previous_), "cuCtxGetCurrent");
  if (previous_ != want) {
    check(api.ctx_set_current(want), "cuCtxSetCurrent");
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) DriverApi::get().ctx_set_current(previous_);
}

int device_attribute(CUdevice_attribute attribute, int device) {
  int value = 0;
  check(DriverApi::get().device_attribute(&value, attribute, device_handle(device)),
        ("cuDeviceGetAttribute(" + std::to_string(int(attribute)) + ")").c_str());
  return value;
}

void mem_info(int device, std::size_t& free_bytes, std::size_t& total_bytes, CUcontext context) {
  DeviceGuard guard(device, context);
  check(DriverApi::get().mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo");
}

}  // namespace cuarena::cuda
