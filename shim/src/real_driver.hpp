// The real entry points behind the shim's hooks: libc's dlsym, the driver's own functions (by
// their exact ABI names, from libcuda.so.1), and the CUDA runtime's for pass-through. Nothing here
// ever returns one of the shim's hooks, so the shim never calls itself.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuarena/driver_symbols.hpp"

namespace cuarena::shim {

/// libc's dlsym (found with dlvsym, so the shim's exported dlsym is never in the way).
using DlsymFn = void* (*)(void*, const char*);
DlsymFn libc_dlsym();
void* real_dlsym(void* handle, const char* name);

/// libcuda.so.1, opened on first use; nullptr when the driver is not installed.
void* libcuda();

/// The driver's cuGetProcAddress_v2; CUDA_ERROR_NOT_INITIALIZED without a driver.
CUresult real_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                               CUdriverProcAddressQueryResult* status);

/// A resolver for cuda::set_driver_resolver: the driver's entry points, never the hooks.
void* driver_resolver(const char* symbol, int cuda_version, std::uint64_t flags);

/// The driver functions the hooks pass through to, or use themselves: the shim's rows of
/// driver_symbols.def, each the driver's symbol of exactly that row's ABI name (nullptr if the
/// driver lacks it).
struct RealDriver {
#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  CUARENA_DRIVER_IF(shim, decltype(&::api) member = nullptr;)
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL

  /// The table, built on first use. Without a driver every entry is nullptr.
  static const RealDriver& get();
};

/// The CUDA runtime's function `name` (cudaFree, ...) from the shared libcudart the process
/// loaded, found after the shim in link order or among the loaded objects; nullptr if none.
void* real_runtime(const char* name);

}  // namespace cuarena::shim
