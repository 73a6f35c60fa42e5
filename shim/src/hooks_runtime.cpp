// The runtime's memory calls, for programs linked against a shared libcudart: served from
// cuarena (serve.hpp) or passed to that libcudart. (A static libcudart reaches the driver hooks
// through cuGetProcAddress instead.)
#include "hooks.hpp"
#include "real_driver.hpp"
#include "serve.hpp"
#include "shim.hpp"

using namespace cuarena::shim;

namespace {
template <class Fn>
Fn runtime(const char* name) {
  return reinterpret_cast<Fn>(real_runtime(name));
}

cudaError_t to_runtime(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_INVALID_CONTEXT:
      return cudaErrorInvalidResourceHandle;
    default:
      return cudaErrorUnknown;
  }
}

/// The runtime makes its device's primary context current at its first call in a thread; a
/// thread whose first call is a hooked one gets the same from cudaFree(nullptr).
void ensure_context() {
  CUcontext ctx = nullptr;
  const RealDriver& d = RealDriver::get();
  if (d.ctx_get_current != nullptr && d.ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr)
    return;
  static const auto real_free = runtime<cudaError_t (*)(void*)>("cudaFree");
  if (real_free != nullptr) real_free(nullptr);
}

template <class Pass>
cudaError_t or_pass(const char* call, std::optional<CUresult> served, Pass&& pass) {
  if (served) return to_runtime(*served);
  Shim& shim = Shim::get();
  shim.passed();
  if (shim.logging()) shim.log("%s passed through", call);
  return pass();
}
}  // namespace

CUARENA_HOOK cudaError_t cudaMalloc(void** devPtr, size_t size) {
  static const auto real = runtime<cudaError_t (*)(void**, size_t)>("cudaMalloc");
  ensure_context();
  return or_pass(
      "cudaMalloc",
      serve_alloc(reinterpret_cast<CUdeviceptr*>(devPtr), size, nullptr, Ordering::kSync),
      [&] { return real ? real(devPtr, size) : cudaErrorInitializationError; });
}

CUARENA_HOOK cudaError_t cudaFree(void* devPtr) {
  static const auto real = runtime<cudaError_t (*)(void*)>("cudaFree");
  return or_pass("cudaFree",
                 serve_free(reinterpret_cast<CUdeviceptr>(devPtr), nullptr, Ordering::kSync),
                 [&] { return real ? real(devPtr) : cudaErrorInitializationError; });
}

CUARENA_HOOK cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  static const auto real =
      runtime<cudaError_t (*)(void**, size_t, cudaStream_t)>("cudaMallocAsync");
  ensure_context();
  return or_pass("cudaMallocAsync",
                 serve_alloc(reinterpret_cast<CUdeviceptr*>(devPtr), size,
                             reinterpret_cast<CUstream>(hStream), Ordering::kAsync),
                 [&] { return real ? real(devPtr, size, hStream) : cudaErrorInitializationError; });
}

CUARENA_HOOK cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  static const auto real = runtime<cudaError_t (*)(void*, cudaStream_t)>("cudaFreeAsync");
  return or_pass("cudaFreeAsync",
                 serve_free(reinterpret_cast<CUdeviceptr>(devPtr),
                            reinterpret_cast<CUstream>(hStream), Ordering::kAsync),
                 [&] { return real ? real(devPtr, hStream) : cudaErrorInitializationError; });
}

CUARENA_HOOK cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  static const auto real = runtime<cudaError_t (*)(size_t*, size_t*)>("cudaMemGetInfo");
  ensure_context();
  return or_pass("cudaMemGetInfo", serve_mem_info(free, total),
                 [&] { return real ? real(free, total) : cudaErrorInitializationError; });
}
