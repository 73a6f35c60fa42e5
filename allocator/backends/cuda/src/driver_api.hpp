// The driver entry points the CUDA backends use, resolved at run time (no link against libcuda
// or libcudart) through the resolver of driver_resolver.hpp.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "cuarena/driver_resolver.hpp"

namespace cuarena::cuda {

struct DriverApi {
  // Virtual memory management.
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  // CUDA IPC (cuda_ipc.cpp): exporting and importing physical memory as file descriptors.
  decltype(&::cuMemRetainAllocationHandle) retain_handle = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  // Devices, contexts, events (context.hpp, events.hpp).
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuMemGetInfo_v2) mem_get_info = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventQuery) event_query = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventDestroy_v2) event_destroy = nullptr;

  /// The process-wide table, built on first use through the resolver (driver_resolver.hpp); throws
  /// BackendError if the driver (libcuda.so.1) or an entry point is missing.
  static const DriverApi& get();

  /// "cuMemMap(...): CUDA_ERROR_... (message)" for an error message.
  std::string describe(CUresult result, const std::string& call) const;
};

/// Throws BackendError unless `result` is CUDA_SUCCESS.
void check(CUresult result, const char* call);

}  // namespace cuarena::cuda
