// Where the CUDA backends find the driver's entry points. By default libcuda.so.1's own
// cuGetProcAddress; a process that interposes on the driver (the LD_PRELOAD shim) installs a
// resolver that returns the real functions, never its hooks, so the backends cannot recurse.
#pragma once

#include <cstdint>

namespace cuarena::cuda {

/// Looks up a driver entry point by its base name (as cuGetProcAddress takes it: "cuMemMap"),
/// for ABI version `cuda_version` (e.g. 12000) and `flags` (CU_GET_PROC_ADDRESS_*); returns
/// nullptr when the driver lacks it.
using DriverResolver = void* (*)(const char* symbol, int cuda_version, std::uint64_t flags);

/// Makes the backends resolve through `resolver` (nullptr: the default). Call before any CUDA
/// backend is created; a table already built is not rebuilt. Not thread-safe.
void set_driver_resolver(DriverResolver resolver);

}  // namespace cuarena::cuda
