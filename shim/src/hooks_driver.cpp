// The driver API's memory calls, served from cuarena (serve.hpp) or passed to the driver.
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "driver_hook.hpp"
#include "hooks.hpp"
#include "ipc_ticket.hpp"
#include "real_driver.hpp"
#include "serve.hpp"
#include "shim.hpp"

using namespace cuarena;
using namespace cuarena::shim;

namespace {
const RealDriver& real() { return RealDriver::get(); }

/// The allocation holding `ptr` in any state: kFound with its base and requested size.
DeviceState::Lookup find_range(CUdeviceptr ptr, DevicePtr& base, std::size_t& size,
                               DeviceState** owner = nullptr) {
  Shim& shim = Shim::get();
  DeviceState* s = shim.holder(DevicePtr(ptr));
  if (s == nullptr) return DeviceState::Lookup::kNotOurs;
  if (owner) *owner = s;
  return s->range(DevicePtr(ptr), base, size);
}

bool is_range_attribute(CUpointer_attribute a) {
  return a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || a == CU_POINTER_ATTRIBUTE_RANGE_SIZE ||
         a == CU_POINTER_ATTRIBUTE_BUFFER_ID;
}

/// Answers a range attribute for an allocation of `s` at [base, base + size).
void answer(DeviceState& s, CUpointer_attribute a, void* data, DevicePtr base, std::size_t size) {
  if (a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
    *static_cast<CUdeviceptr*>(data) = CUdeviceptr(base);
  if (a == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *static_cast<size_t*>(data) = size;
  if (a == CU_POINTER_ATTRIBUTE_BUFFER_ID)
    *static_cast<unsigned long long*>(data) = s.buffer_id(base);
}

/// The objects (and functions, where exported) on the caller's stack, innermost first: who
/// made a stream, for CUARENA_LOG.
std::string callers() {
  void* frames[12];
  const int n = backtrace(frames, 12);
  std::string out;
  for (int i = 2; i < n; ++i) {  // past this function and the hook
    Dl_info info{};
    if (dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) continue;
    const char* base = std::strrchr(info.dli_fname, '/');
    out += out.empty() ? "" : " < ";
    out += base ? base + 1 : info.dli_fname;
    if (info.dli_sname) out += std::string(":") + info.dli_sname;
  }
  return out;
}

/// The state of the context `stream` belongs to (the current one for the default streams).
DeviceState* state_of(CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
    return Shim::get().current();
  CUcontext ctx = nullptr;
  if (real().stream_get_ctx(stream, &ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  return Shim::get().of_context(ctx);
}

/// A stream create: a parked stream of the same kind if there is one, else the driver's.
template <class Create>
CUresult create_stream(CUstream* phStream, unsigned flags, int priority, Create&& create) {
  Shim& shim = Shim::get();
  DeviceState* s = phStream != nullptr ? shim.current() : nullptr;
  CUresult r = CUDA_SUCCESS;
  CUstream parked = s != nullptr ? s->reuse_stream(flags, priority) : nullptr;
  if (parked != nullptr) {
    *phStream = parked;
  } else {
    r = create();
    if (r == CUDA_SUCCESS && s != nullptr) s->add_stream(*phStream, false);
  }
  if (r == CUDA_SUCCESS && shim.logging())
    shim.log("stream %p %s (flags %#x, priority %d) by %s", static_cast<void*>(*phStream),
             parked ? "handed back" : "created", flags, priority, callers().c_str());
  return r;
}
}  // namespace

CUARENA_HOOK CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return or_pass("cuMemAlloc_v2", serve_alloc(dptr, bytesize, nullptr, Ordering::kSync),
                 [&] { return real().mem_alloc(dptr, bytesize); });
}

CUARENA_HOOK CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return or_pass("cuMemFree_v2", serve_free(dptr, nullptr, Ordering::kSync),
                 [&] { return real().mem_free(dptr); });
}

CUARENA_HOOK CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return or_pass("cuMemAllocAsync", serve_alloc(dptr, bytesize, stream, Ordering::kAsync),
                 [&] { return real().mem_alloc_async(dptr, bytesize, stream); });
}

CUARENA_HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return or_pass("cuMemAllocAsync_ptsz",
                 serve_alloc(dptr, bytesize, stream, Ordering::kAsyncPerThread),
                 [&] { return real().mem_alloc_async_ptsz(dptr, bytesize, stream); });
}

CUARENA_HOOK CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return or_pass("cuMemFreeAsync", serve_free(dptr, stream, Ordering::kAsync),
                 [&] { return real().mem_free_async(dptr, stream); });
}

CUARENA_HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return or_pass("cuMemFreeAsync_ptsz", serve_free(dptr, stream, Ordering::kAsyncPerThread),
                 [&] { return real().mem_free_async_ptsz(dptr, stream); });
}

namespace {
/// cuMemAllocFromPoolAsync is served for the device's default pool (what cuMemAllocAsync uses);
/// a pool the program made is its own business.
bool default_pool(CUmemoryPool pool) {
  CUdevice device = 0;
  CUmemoryPool def = nullptr;
  return real().ctx_get_device(&device) == CUDA_SUCCESS &&
         real().device_get_default_mem_pool(&def, device) == CUDA_SUCCESS && def == pool;
}
}  // namespace

CUARENA_HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream stream) {
  std::optional<CUresult> r;
  if (default_pool(pool)) r = serve_alloc(dptr, bytesize, stream, Ordering::kAsync);
  return or_pass("cuMemAllocFromPoolAsync", r,
                 [&] { return real().mem_alloc_from_pool_async(dptr, bytesize, pool, stream); });
}

CUARENA_HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                   CUmemoryPool pool, CUstream stream) {
  std::optional<CUresult> r;
  if (default_pool(pool)) r = serve_alloc(dptr, bytesize, stream, Ordering::kAsyncPerThread);
  return or_pass("cuMemAllocFromPoolAsync_ptsz", r, [&] {
    return real().mem_alloc_from_pool_async_ptsz(dptr, bytesize, pool, stream);
  });
}

CUARENA_HOOK CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return or_pass("cuMemGetInfo_v2", serve_mem_info(free, total),
                 [&] { return real().mem_get_info(free, total); });
}

CUARENA_HOOK CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return guarded("cuMemGetAddressRange_v2", [&]() -> CUresult {
    DevicePtr base = 0;
    std::size_t size = 0;
    switch (find_range(dptr, base, size)) {
      case DeviceState::Lookup::kFound:
        if (pbase) *pbase = CUdeviceptr(base);
        if (psize) *psize = size;
        Shim::get().served();
        return CUDA_SUCCESS;
      case DeviceState::Lookup::kNotLive:
        return CUDA_ERROR_NOT_FOUND;
      case DeviceState::Lookup::kNotOurs:
        break;
    }
    Shim::get().passed();
    Shim::get().log("cuMemGetAddressRange_v2 passed through");
    return real().mem_get_address_range(pbase, psize, dptr);
  });
}

CUARENA_HOOK CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                            CUdeviceptr ptr) {
  return guarded("cuPointerGetAttribute", [&]() -> CUresult {
    if (data != nullptr && is_range_attribute(attribute)) {
      DevicePtr base = 0;
      std::size_t size = 0;
      DeviceState* s = nullptr;
      switch (find_range(ptr, base, size, &s)) {
        case DeviceState::Lookup::kFound:
          answer(*s, attribute, data, base, size);
          Shim::get().served();
          return CUDA_SUCCESS;
        case DeviceState::Lookup::kNotLive:
          return CUDA_ERROR_INVALID_VALUE;
        case DeviceState::Lookup::kNotOurs:
          break;
      }
    }
    Shim::get().passed();
    if (Shim::get().logging())
      Shim::get().log("cuPointerGetAttribute(%d) passed through", int(attribute));
    return real().pointer_get_attribute(data, attribute, ptr);
  });
}

CUARENA_HOOK CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                             CUpointer_attribute* attributes, void** data,
                                             CUdeviceptr ptr) {
  return guarded("cuPointerGetAttributes", [&]() -> CUresult {
    // The driver answers the rest (memory type, device, context: the mapping's own).
    const CUresult r = real().pointer_get_attributes(numAttributes, attributes, data, ptr);
    if (r != CUDA_SUCCESS || attributes == nullptr || data == nullptr) return r;
    DevicePtr base = 0;
    std::size_t size = 0;
    DeviceState* s = nullptr;
    if (find_range(ptr, base, size, &s) != DeviceState::Lookup::kFound) return r;
    for (unsigned i = 0; i < numAttributes; ++i)
      if (data[i] != nullptr && is_range_attribute(attributes[i]))
        answer(*s, attributes[i], data[i], base, size);
    Shim::get().served();
    return r;
  });
}

CUARENA_HOOK CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  DevicePtr base = 0;
  std::size_t size = 0;
  DeviceState* s = nullptr;
  switch (find_range(dptr, base, size, &s)) {
    case DeviceState::Lookup::kNotOurs:
      Shim::get().passed();
      return real().ipc_get_mem_handle(pHandle, dptr);
    case DeviceState::Lookup::kNotLive:
      return CUDA_ERROR_INVALID_VALUE;
    case DeviceState::Lookup::kFound:
      break;
  }
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  try {
    std::optional<Allocator::BlockInfo> block = s->find(base);
    if (!block) return CUDA_ERROR_INVALID_VALUE;
    std::size_t offset = 0;
    const std::string& record = s->ipc_record(base, *block, offset);
    *pHandle = make_ticket(s->device(), record, offset);
    Shim::get().served();
    Shim::get().log("IPC handle for %#llx (%zu B)", static_cast<unsigned long long>(base), size);
    return CUDA_SUCCESS;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena: cuIpcGetMemHandle: %s\n", e.what());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUARENA_HOOK CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                            unsigned int Flags) {
  if (!is_ticket(handle)) {
    Shim::get().passed();
    return real().ipc_open_mem_handle(pdptr, handle, Flags);
  }
  if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  try {
    CUdeviceptr ptr = 0;
    std::shared_ptr<void> mapping = open_ticket(handle, ptr);
    Shim::get().add_import(ptr, std::move(mapping));
    *pdptr = ptr;
    Shim::get().served();
    return CUDA_SUCCESS;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena: cuIpcOpenMemHandle: %s\n", e.what());
    return CUDA_ERROR_INVALID_VALUE;
  }
}

CUARENA_HOOK CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  if (Shim::get().close_import(dptr)) {
    Shim::get().served();
    return CUDA_SUCCESS;
  }
  Shim::get().passed();
  return real().ipc_close_mem_handle(dptr);
}

CUARENA_HOOK CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return guarded("cuStreamCreate", [&]() -> CUresult {
    return create_stream(phStream, Flags, 0, [&] { return real().stream_create(phStream, Flags); });
  });
}

CUARENA_HOOK CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                 int priority) {
  return guarded("cuStreamCreateWithPriority", [&]() -> CUresult {
    // The driver clamps the priority to the device's range; so does a parked stream's match.
    int least = 0, greatest = 0;
    using Range = CUresult (*)(int*, int*);
    static const Range range =
        reinterpret_cast<Range>(real_dlsym(libcuda(), "cuCtxGetStreamPriorityRange"));
    if (range != nullptr && range(&least, &greatest) == CUDA_SUCCESS)
      priority = std::min(least, std::max(greatest, priority));
    return create_stream(phStream, flags, priority, [&] {
      return real().stream_create_with_priority(phStream, flags, priority);
    });
  });
}

CUARENA_HOOK CUresult cuStreamDestroy_v2(CUstream hStream) {
  if (DeviceState* s = hStream != nullptr ? state_of(hStream) : nullptr) {
    try {
      if (!s->retire_stream(hStream)) return CUDA_SUCCESS;  // parked for cuarena
    } catch (const std::exception& e) {
      Shim::get().log("stream %p: %s", static_cast<void*>(hStream), e.what());
    }
  }
  return real().stream_destroy(hStream);
}

namespace {
/// A capture begun by `begin` (the driver's call) on `stream` as that ABI names it.
template <class Begin>
CUresult begin_capture(CUstream stream, bool ptsz, Begin&& begin) {
  if (ptsz && stream == nullptr) stream = CU_STREAM_PER_THREAD;
  DeviceState* s = state_of(stream);
  // Counted before the driver starts it: no allocation may be served while it might capture.
  if (s != nullptr) s->capture_begins(stream);
  const CUresult r = begin();
  if (s != nullptr && r != CUDA_SUCCESS) s->capture_ends(stream);
  return r;
}

template <class End>
CUresult end_capture(CUstream stream, bool ptsz, End&& end) {
  if (ptsz && stream == nullptr) stream = CU_STREAM_PER_THREAD;
  const CUresult r = end();  // ends the capture whatever it returns (an invalidated one too)
  if (DeviceState* s = state_of(stream)) s->capture_ends(stream);
  return r;
}
}  // namespace

CUARENA_HOOK CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return guarded("cuStreamBeginCapture_v2", [&] {
    return begin_capture(hStream, false,
                         [&] { return real().stream_begin_capture(hStream, mode); });
  });
}

CUARENA_HOOK CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return guarded("cuStreamBeginCapture_v2_ptsz", [&] {
    return begin_capture(hStream, true,
                         [&] { return real().stream_begin_capture_ptsz(hStream, mode); });
  });
}

CUARENA_HOOK CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode* dependencies,
                                                  const CUgraphEdgeData* dependencyData,
                                                  size_t numDependencies,
                                                  CUstreamCaptureMode mode) {
  return guarded("cuStreamBeginCaptureToGraph", [&] {
    return begin_capture(hStream, false, [&] {
      return real().stream_begin_capture_to_graph(hStream, hGraph, dependencies, dependencyData,
                                                  numDependencies, mode);
    });
  });
}

CUARENA_HOOK CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                       const CUgraphNode* dependencies,
                                                       const CUgraphEdgeData* dependencyData,
                                                       size_t numDependencies,
                                                       CUstreamCaptureMode mode) {
  return guarded("cuStreamBeginCaptureToGraph_ptsz", [&] {
    return begin_capture(hStream, true, [&] {
      return real().stream_begin_capture_to_graph_ptsz(hStream, hGraph, dependencies,
                                                       dependencyData, numDependencies, mode);
    });
  });
}

CUARENA_HOOK CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return guarded("cuStreamEndCapture", [&] {
    return end_capture(hStream, false, [&] { return real().stream_end_capture(hStream, phGraph); });
  });
}

CUARENA_HOOK CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return guarded("cuStreamEndCapture_ptsz", [&] {
    return end_capture(hStream, true,
                       [&] { return real().stream_end_capture_ptsz(hStream, phGraph); });
  });
}
