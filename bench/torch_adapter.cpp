// PyTorch's CUDA caching allocator for cuarena_gpu_bench (see torch_adapter.hpp). Built only with
// -DCUARENA_WITH_TORCH=ON, against the installed torch's headers and libc10_cuda, as
// tools/replay/src/torch_replay.cpp is.
#include "torch_adapter.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>

namespace cca = c10::cuda::CUDACachingAllocator;

namespace cuarena::bench::torch_native {

namespace {

thread_local std::string t_last_error;

void set_error(const char* what, const std::exception& e) {
  t_last_error = std::string(what) + ": " + e.what();
}

}  // namespace

bool init() {
  static std::once_flag once;
  static std::string init_error;  // written once, under call_once
  try {
    std::call_once(once, [] {
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        init_error = "torch: no CUDA device";
        return;
      }
      try {
        cca::init(count);
      } catch (const std::exception& e) {
        init_error = std::string("torch: CUDACachingAllocator::init: ") + e.what();
      }
    });
  } catch (const std::exception& e) {
    set_error("torch: init", e);
    return false;
  }
  if (!init_error.empty()) {
    t_last_error = init_error;
    return false;
  }
  return true;
}

AllocStatus allocate(std::size_t bytes, void* stream, void** out) {
  *out = nullptr;
  try {
    *out = cca::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
    return AllocStatus::kOk;
  } catch (const c10::OutOfMemoryError&) {
    return AllocStatus::kOutOfMemory;
  } catch (const std::exception& e) {
    set_error("torch: raw_alloc_with_stream", e);
    return AllocStatus::kError;
  }
}

bool deallocate(void* ptr) {
  try {
    cca::raw_delete(ptr);
    return true;
  } catch (const std::exception& e) {
    set_error("torch: raw_delete", e);
    return false;
  }
}

bool empty_cache() {
  try {
    cca::emptyCache();
    return true;
  } catch (const std::exception& e) {
    set_error("torch: emptyCache", e);
    return false;
  }
}

bool stats(int device, Stats* out) {
  try {
    const auto s = cca::getDeviceStats(c10::DeviceIndex(device));
    out->reserved_bytes = s.reserved_bytes[0].current;
    out->num_device_alloc = s.num_device_alloc;
    out->num_device_free = s.num_device_free;
    out->num_alloc_retries = s.num_alloc_retries;
    return true;
  } catch (const std::exception& e) {
    set_error("torch: getDeviceStats", e);
    return false;
  }
}

const char* last_error() { return t_last_error.c_str(); }

}  // namespace cuarena::bench::torch_native
