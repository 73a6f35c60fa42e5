// The driver entry points the CUDA backends use (driver_symbols.def, the rows marked for the
// backend), resolved at run time (no link against libcuda or libcudart) through the resolver of
// driver_resolver.hpp. Public for the tools that time or drive the same calls (bench/vmm_costs).
#pragma once

#include <cstdint>
#include <string>

#include "cuarena/driver_resolver.hpp"
#include "cuarena/driver_symbols.hpp"

namespace cuarena::cuda {

/// One field per backend row of driver_symbols.def (mem_create is cuMemCreate, event_destroy
/// cuEventDestroy_v2, ...), each of its ABI's type.
struct DriverApi {
#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  CUARENA_DRIVER_IF(backend, decltype(&::api) member = nullptr;)
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL

  /// The process-wide table, built on first use through the resolver (driver_resolver.hpp);
  /// thread-safe. Throws BackendError if the driver (libcuda.so.1) or an entry point is missing.
  static const DriverApi& get();

  /// "cuMemMap(...): CUDA_ERROR_... (message)" for an error message.
  std::string describe(CUresult result, const std::string& call) const;
};

/// Throws BackendError unless `result` is CUDA_SUCCESS.
void check(CUresult result, const char* call);

}  // namespace cuarena::cuda
