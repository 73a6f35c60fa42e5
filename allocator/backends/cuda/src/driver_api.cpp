#include "driver_api.hpp"

#include <cuda_runtime_api.h>

#include "cuarena/errors.hpp"

namespace cuarena::cuda {

namespace {

template <class Fn>
void resolve(Fn& fn, const char* symbol) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  // 12000: the ABI of these entry points has not changed since CUDA 12.0.
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &ptr, 12000, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
    throw BackendError(std::string("cuarena: driver entry point ") + symbol +
                       " not available: " + cudaGetErrorString(err));
  }
  fn = reinterpret_cast<Fn>(ptr);
}

}  // namespace

const DriverApi& DriverApi::get() {
  static const DriverApi api = [] {
    DriverApi a;
    resolve(a.mem_create, "cuMemCreate");
    resolve(a.mem_release, "cuMemRelease");
    resolve(a.address_reserve, "cuMemAddressReserve");
    resolve(a.address_free, "cuMemAddressFree");
    resolve(a.mem_map, "cuMemMap");
    resolve(a.mem_unmap, "cuMemUnmap");
    resolve(a.mem_set_access, "cuMemSetAccess");
    resolve(a.granularity, "cuMemGetAllocationGranularity");
    resolve(a.error_string, "cuGetErrorString");
    resolve(a.retain_handle, "cuMemRetainAllocationHandle");
    resolve(a.export_handle, "cuMemExportToShareableHandle");
    resolve(a.import_handle, "cuMemImportFromShareableHandle");
    return a;
  }();
  return api;
}

std::string DriverApi::describe(CUresult result, const std::string& call) const {
  const char* msg = nullptr;
  if (error_string == nullptr || error_string(result, &msg) != CUDA_SUCCESS || msg == nullptr)
    msg = "unknown error";
  return "cuarena: " + call + " failed: " + msg + " (CUresult " + std::to_string(int(result)) + ")";
}

void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) throw BackendError(DriverApi::get().describe(result, call));
}

}  // namespace cuarena::cuda
