// The driver entry points the VMM backend uses, resolved at run time through
// cudaGetDriverEntryPointByVersion (no link against libcuda).
#pragma once

#include <cuda.h>

#include <string>

namespace cuarena::cuda {

struct DriverApi {
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

  /// The process-wide table; throws BackendError if an entry point is missing.
  static const DriverApi& get();

  /// "cuMemMap(...): CUDA_ERROR_... (message)" for an error message.
  std::string describe(CUresult result, const std::string& call) const;
};

/// Throws BackendError unless `result` is CUDA_SUCCESS.
void check(CUresult result, const char* call);

}  // namespace cuarena::cuda
