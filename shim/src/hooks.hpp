// The shim's exported hooks (exports.map lists the same names), declared with the driver's and
// the runtime's exact ABIs, so interpose.cpp can hand them out by name.
#pragma once

#include <cuda.h>
#include <driver_types.h>

#include <cstddef>

#define CUARENA_HOOK extern "C" __attribute__((visibility("default")))

// Driver (hooks_driver.cpp). Names are the ABI symbols: cuda.h's macros map cuMemAlloc to
// cuMemAlloc_v2 and so on; the _ptsz variants are the per-thread-default-stream ABIs.
CUARENA_HOOK CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
CUARENA_HOOK CUresult cuMemFree_v2(CUdeviceptr dptr);
CUARENA_HOOK CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUARENA_HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUARENA_HOOK CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUARENA_HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUARENA_HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream stream);
CUARENA_HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                   CUmemoryPool pool, CUstream stream);
CUARENA_HOOK CUresult cuMemGetInfo_v2(size_t* free, size_t* total);
CUARENA_HOOK CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr);
CUARENA_HOOK CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                            CUdeviceptr ptr);
CUARENA_HOOK CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                             CUpointer_attribute* attributes, void** data,
                                             CUdeviceptr ptr);
CUARENA_HOOK CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr);
CUARENA_HOOK CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                            unsigned int Flags);
CUARENA_HOOK CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUARENA_HOOK CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags);
CUARENA_HOOK CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                 int priority);
CUARENA_HOOK CUresult cuStreamDestroy_v2(CUstream hStream);
// Graph captures, counted so that "does any stream capture?" costs no driver call.
CUARENA_HOOK CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUARENA_HOOK CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUARENA_HOOK CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode* dependencies,
                                                  const CUgraphEdgeData* dependencyData,
                                                  size_t numDependencies, CUstreamCaptureMode mode);
CUARENA_HOOK CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                       const CUgraphNode* dependencies,
                                                       const CUgraphEdgeData* dependencyData,
                                                       size_t numDependencies,
                                                       CUstreamCaptureMode mode);
CUARENA_HOOK CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph);
CUARENA_HOOK CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);

// Virtual memory management (hooks_vmm.cpp).
CUARENA_HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                  const CUmemAllocationProp* prop, unsigned long long flags);
CUARENA_HOOK CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                          CUdeviceptr addr, unsigned long long flags);
CUARENA_HOOK CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                               CUmemGenericAllocationHandle handle, unsigned long long flags);
CUARENA_HOOK CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                     size_t count);
CUARENA_HOOK CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUARENA_HOOK CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUARENA_HOOK CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUARENA_HOOK CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr);
CUARENA_HOOK CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                             CUmemGenericAllocationHandle handle);
CUARENA_HOOK CUresult cuMemExportToShareableHandle(void* shareable,
                                                   CUmemGenericAllocationHandle handle,
                                                   CUmemAllocationHandleType type,
                                                   unsigned long long flags);

// Resolvers (interpose.cpp).
CUARENA_HOOK void* dlsym(void* handle, const char* name) noexcept;
CUARENA_HOOK CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags,
                                          CUdriverProcAddressQueryResult* symbolStatus);
/// The CUDA 11 ABI of cuGetProcAddress (cuda.h maps the name to _v2, so it is declared apart).
CUARENA_HOOK CUresult cuarena_cuGetProcAddress_v1(const char* symbol, void** pfn, int cudaVersion,
                                                  cuuint64_t flags) __asm__("cuGetProcAddress");
CUARENA_HOOK cudaError_t
cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                        enum cudaDriverEntryPointQueryResult* driverStatus);
CUARENA_HOOK cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* driverStatus);

// Runtime, for callers of a shared libcudart (hooks_runtime.cpp).
CUARENA_HOOK cudaError_t cudaMalloc(void** devPtr, size_t size);
CUARENA_HOOK cudaError_t cudaFree(void* devPtr);
CUARENA_HOOK cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream);
CUARENA_HOOK cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream);
CUARENA_HOOK cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
