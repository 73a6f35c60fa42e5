// The real entry points behind the shim's hooks: libc's dlsym, the driver's own functions (by
// their exact ABI names, from libcuda.so.1), and the CUDA runtime's for pass-through. Nothing here
// ever returns one of the shim's hooks, so the shim never calls itself.
#pragma once

#include <cuda.h>

#include <cstdint>

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

/// The driver functions the hooks pass through to, or use themselves. Each is the driver's
/// symbol of exactly that name (nullptr if the driver lacks it).
struct RealDriver {
  decltype(&::cuMemAlloc_v2) mem_alloc = nullptr;
  decltype(&::cuMemFree_v2) mem_free = nullptr;
  CUresult (*mem_alloc_async)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*mem_alloc_async_ptsz)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*mem_free_async)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*mem_free_async_ptsz)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*mem_alloc_from_pool_async)(CUdeviceptr*, size_t, CUmemoryPool, CUstream) = nullptr;
  CUresult (*mem_alloc_from_pool_async_ptsz)(CUdeviceptr*, size_t, CUmemoryPool,
                                             CUstream) = nullptr;
  decltype(&::cuMemGetInfo_v2) mem_get_info = nullptr;
  decltype(&::cuMemGetAddressRange_v2) mem_get_address_range = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_get_attribute = nullptr;
  decltype(&::cuPointerGetAttributes) pointer_get_attributes = nullptr;
  decltype(&::cuIpcGetMemHandle) ipc_get_mem_handle = nullptr;
  decltype(&::cuIpcOpenMemHandle_v2) ipc_open_mem_handle = nullptr;
  decltype(&::cuIpcCloseMemHandle) ipc_close_mem_handle = nullptr;
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamCreateWithPriority) stream_create_with_priority = nullptr;
  decltype(&::cuStreamDestroy_v2) stream_destroy = nullptr;
  CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus*) = nullptr;
  CUresult (*stream_get_flags)(CUstream, unsigned int*) = nullptr;
  CUresult (*stream_get_priority)(CUstream, int*) = nullptr;
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&::cuDeviceGetDefaultMemPool) device_get_default_mem_pool = nullptr;
  CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int) = nullptr;
  CUresult (*stream_query)(CUstream) = nullptr;
  CUresult (*stream_begin_capture)(CUstream, CUstreamCaptureMode) = nullptr;
  CUresult (*stream_begin_capture_ptsz)(CUstream, CUstreamCaptureMode) = nullptr;
  CUresult (*stream_begin_capture_to_graph)(CUstream, CUgraph, const CUgraphNode*,
                                            const CUgraphEdgeData*, size_t,
                                            CUstreamCaptureMode) = nullptr;
  CUresult (*stream_begin_capture_to_graph_ptsz)(CUstream, CUgraph, const CUgraphNode*,
                                                 const CUgraphEdgeData*, size_t,
                                                 CUstreamCaptureMode) = nullptr;
  CUresult (*stream_end_capture)(CUstream, CUgraph*) = nullptr;
  CUresult (*stream_end_capture_ptsz)(CUstream, CUgraph*) = nullptr;

  /// The table, built on first use. Without a driver every entry is nullptr.
  static const RealDriver& get();
};

/// The CUDA runtime's function `name` (cudaFree, ...) from the shared libcudart the process
/// loaded, found after the shim in link order or among the loaded objects; nullptr if none.
void* real_runtime(const char* name);

}  // namespace cuarena::shim
