#include "real_driver.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>
#include <vector>

namespace cuarena::shim {

__attribute__((no_sanitize("address"))) DlsymFn libc_dlsym() {
  // glibc 2.34 moved dlsym into libc under a new version; older ones have only 2.2.5.
  static const DlsymFn fn = [] {
    void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(f);
  }();
  return fn;
}

namespace {

template <class Fn>
void load(Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(real_dlsym(libcuda(), name));
}
}  // namespace

void* real_dlsym(void* handle, const char* name) {
  const DlsymFn fn = libc_dlsym();
  return fn ? fn(handle, name) : nullptr;
}

void* libcuda() {
  static void* const lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib;
}

CUresult real_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                               CUdriverProcAddressQueryResult* status) {
  using Fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  static const Fn fn = [] {
    void* lib = libcuda();
    return lib ? reinterpret_cast<Fn>(real_dlsym(lib, "cuGetProcAddress_v2")) : nullptr;
  }();
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return fn(symbol, pfn, cuda_version, flags, status);
}

void* driver_resolver(const char* symbol, int cuda_version, std::uint64_t flags) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (real_get_proc_address(symbol, &fn, cuda_version, flags, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS)
    return nullptr;
  return fn;
}

const RealDriver& RealDriver::get() {
  static const RealDriver table = [] {
    RealDriver t;
    if (libcuda() == nullptr) return t;
    load(t.mem_alloc, "cuMemAlloc_v2");
    load(t.mem_free, "cuMemFree_v2");
    load(t.mem_alloc_async, "cuMemAllocAsync");
    load(t.mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz");
    load(t.mem_free_async, "cuMemFreeAsync");
    load(t.mem_free_async_ptsz, "cuMemFreeAsync_ptsz");
    load(t.mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync");
    load(t.mem_alloc_from_pool_async_ptsz, "cuMemAllocFromPoolAsync_ptsz");
    load(t.mem_get_info, "cuMemGetInfo_v2");
    load(t.mem_get_address_range, "cuMemGetAddressRange_v2");
    load(t.pointer_get_attribute, "cuPointerGetAttribute");
    load(t.pointer_get_attributes, "cuPointerGetAttributes");
    load(t.ipc_get_mem_handle, "cuIpcGetMemHandle");
    load(t.ipc_open_mem_handle, "cuIpcOpenMemHandle_v2");
    load(t.ipc_close_mem_handle, "cuIpcCloseMemHandle");
    load(t.stream_create, "cuStreamCreate");
    load(t.stream_create_with_priority, "cuStreamCreateWithPriority");
    load(t.stream_destroy, "cuStreamDestroy_v2");
    load(t.stream_is_capturing, "cuStreamIsCapturing");
    load(t.stream_get_flags, "cuStreamGetFlags");
    load(t.stream_get_priority, "cuStreamGetPriority");
    load(t.stream_get_ctx, "cuStreamGetCtx");
    load(t.ctx_get_current, "cuCtxGetCurrent");
    load(t.ctx_set_current, "cuCtxSetCurrent");
    load(t.ctx_get_device, "cuCtxGetDevice");
    load(t.device_get_default_mem_pool, "cuDeviceGetDefaultMemPool");
    load(t.event_create, "cuEventCreate");
    load(t.event_record, "cuEventRecord");
    load(t.event_query, "cuEventQuery");
    load(t.event_synchronize, "cuEventSynchronize");
    load(t.event_destroy, "cuEventDestroy_v2");
    load(t.stream_wait_event, "cuStreamWaitEvent");
    load(t.stream_query, "cuStreamQuery");
    load(t.stream_begin_capture, "cuStreamBeginCapture_v2");
    load(t.stream_begin_capture_ptsz, "cuStreamBeginCapture_v2_ptsz");
    load(t.stream_begin_capture_to_graph, "cuStreamBeginCaptureToGraph");
    load(t.stream_begin_capture_to_graph_ptsz, "cuStreamBeginCaptureToGraph_ptsz");
    load(t.stream_end_capture, "cuStreamEndCapture");
    load(t.stream_end_capture_ptsz, "cuStreamEndCapture_ptsz");
    return t;
  }();
  return table;
}

void* real_runtime(const char* name) {
  if (void* fn = real_dlsym(RTLD_NEXT, name)) return fn;
  // A libcudart loaded by dlopen with RTLD_LOCAL (Python extension modules) is not in the global
  // scope RTLD_NEXT searches: look for it among the loaded objects. (Their paths are collected
  // first and opened after the walk: dlopen inside dl_iterate_phdr's callback would take the
  // loader's locks in the opposite order to a concurrent dlopen.)
  std::vector<std::string> paths;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        const char* path = info->dlpi_name;
        const char* base = path ? std::strrchr(path, '/') : nullptr;
        base = base ? base + 1 : path;
        if (base != nullptr && std::strncmp(base, "libcudart.so", 12) == 0)
          static_cast<std::vector<std::string>*>(data)->emplace_back(path);
        return 0;
      },
      &paths);
  for (const std::string& path : paths) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) continue;
    void* fn = real_dlsym(lib, name);
    dlclose(lib);  // RTLD_NOLOAD took a reference; the library stays loaded
    if (fn != nullptr) return fn;
  }
  return nullptr;
}

}  // namespace cuarena::shim
