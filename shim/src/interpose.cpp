// How callers find the shim: the exported dlsym (libcudart, XLA and ctypes look driver entry
// points up by name), and the driver's own resolvers (cuGetProcAddress, and the runtime's
// cudaGetDriverEntryPoint*), which are asked first and whose answer is replaced by the shim's
// hook when it is the driver's function of a name the shim serves. Matching by the returned
// pointer (as NVIDIA's cuinterpose does) honours the ABI version and the per-thread-stream flag
// the caller asked for: the driver picked the variant; the shim serves that exact one or none.
#include <dlfcn.h>

#include <array>
#include <cstring>
#include <string_view>

#include "hooks.hpp"
#include "real_driver.hpp"
#include "serve.hpp"
#include "shim.hpp"

using namespace cuarena::shim;

namespace {

struct Served {
  const char* name;
  void* hook;
  bool driver;  // a libcuda symbol (else the runtime's)
};

constexpr std::size_t kServed = 43;

__attribute__((no_sanitize("address"))) const std::array<Served, kServed>& served() {
  static const std::array<Served, kServed> table = {{
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuarena_cuGetProcAddress_v1), true},
      {"cuGetProcAddress_v2", reinterpret_cast<void*>(&cuGetProcAddress_v2), true},
      {"cuMemAlloc_v2", reinterpret_cast<void*>(&cuMemAlloc_v2), true},
      {"cuMemFree_v2", reinterpret_cast<void*>(&cuMemFree_v2), true},
      {"cuMemAllocAsync", reinterpret_cast<void*>(&cuMemAllocAsync), true},
      {"cuMemAllocAsync_ptsz", reinterpret_cast<void*>(&cuMemAllocAsync_ptsz), true},
      {"cuMemFreeAsync", reinterpret_cast<void*>(&cuMemFreeAsync), true},
      {"cuMemFreeAsync_ptsz", reinterpret_cast<void*>(&cuMemFreeAsync_ptsz), true},
      {"cuMemAllocFromPoolAsync", reinterpret_cast<void*>(&cuMemAllocFromPoolAsync), true},
      {"cuMemAllocFromPoolAsync_ptsz", reinterpret_cast<void*>(&cuMemAllocFromPoolAsync_ptsz),
       true},
      {"cuMemGetInfo_v2", reinterpret_cast<void*>(&cuMemGetInfo_v2), true},
      {"cuMemGetAddressRange_v2", reinterpret_cast<void*>(&cuMemGetAddressRange_v2), true},
      {"cuPointerGetAttribute", reinterpret_cast<void*>(&cuPointerGetAttribute), true},
      {"cuPointerGetAttributes", reinterpret_cast<void*>(&cuPointerGetAttributes), true},
      {"cuIpcGetMemHandle", reinterpret_cast<void*>(&cuIpcGetMemHandle), true},
      {"cuIpcOpenMemHandle_v2", reinterpret_cast<void*>(&cuIpcOpenMemHandle_v2), true},
      {"cuIpcCloseMemHandle", reinterpret_cast<void*>(&cuIpcCloseMemHandle), true},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate), true},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve), true},
      {"cuMemMap", reinterpret_cast<void*>(&cuMemMap), true},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess), true},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap), true},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree), true},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease), true},
      {"cuMemRetainAllocationHandle", reinterpret_cast<void*>(&cuMemRetainAllocationHandle), true},
      {"cuMemGetAllocationPropertiesFromHandle",
       reinterpret_cast<void*>(&cuMemGetAllocationPropertiesFromHandle), true},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&cuMemExportToShareableHandle),
       true},
      {"cuStreamCreate", reinterpret_cast<void*>(&cuStreamCreate), true},
      {"cuStreamCreateWithPriority", reinterpret_cast<void*>(&cuStreamCreateWithPriority), true},
      {"cuStreamDestroy_v2", reinterpret_cast<void*>(&cuStreamDestroy_v2), true},
      {"cuStreamBeginCapture_v2", reinterpret_cast<void*>(&cuStreamBeginCapture_v2), true},
      {"cuStreamBeginCapture_v2_ptsz", reinterpret_cast<void*>(&cuStreamBeginCapture_v2_ptsz),
       true},
      {"cuStreamBeginCaptureToGraph", reinterpret_cast<void*>(&cuStreamBeginCaptureToGraph), true},
      {"cuStreamBeginCaptureToGraph_ptsz",
       reinterpret_cast<void*>(&cuStreamBeginCaptureToGraph_ptsz), true},
      {"cuStreamEndCapture", reinterpret_cast<void*>(&cuStreamEndCapture), true},
      {"cuStreamEndCapture_ptsz", reinterpret_cast<void*>(&cuStreamEndCapture_ptsz), true},
      {"cudaGetDriverEntryPoint", reinterpret_cast<void*>(&cudaGetDriverEntryPoint), false},
      {"cudaGetDriverEntryPointByVersion",
       reinterpret_cast<void*>(&cudaGetDriverEntryPointByVersion), false},
      {"cudaMalloc", reinterpret_cast<void*>(&cudaMalloc), false},
      {"cudaFree", reinterpret_cast<void*>(&cudaFree), false},
      {"cudaMallocAsync", reinterpret_cast<void*>(&cudaMallocAsync), false},
      {"cudaFreeAsync", reinterpret_cast<void*>(&cudaFreeAsync), false},
      {"cudaMemGetInfo", reinterpret_cast<void*>(&cudaMemGetInfo), false},
  }};
  return table;
}

/// The hook for exactly `name` (cuDNN's cudnn* or a cuMem* the shim does not serve: none).
/// (Not instrumented: an ASan runtime calls dlsym while it starts, before it can check memory.)
__attribute__((no_sanitize("address"))) void* hook_by_name(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return nullptr;
  for (const Served& s : served())
    if (std::strcmp(s.name, name) == 0) return s.hook;
  return nullptr;
}

/// The hook whose driver function is `fn`, or nullptr.
void* hook_by_pointer(void* fn) {
  static const std::array<void*, kServed> real = [] {
    std::array<void*, kServed> r{};
    void* lib = libcuda();
    for (std::size_t i = 0; i < served().size(); ++i)
      r[i] = (lib && served()[i].driver) ? real_dlsym(lib, served()[i].name) : nullptr;
    return r;
  }();
  for (std::size_t i = 0; i < real.size(); ++i)
    if (real[i] != nullptr && real[i] == fn) return served()[i].hook;
  return nullptr;
}

}  // namespace

namespace cuarena::shim {

void* substitute(const char* symbol, void* fn) {
  if (fn == nullptr) return fn;
  if (void* hook = hook_by_pointer(fn)) return hook;
  Shim& shim = Shim::get();
  if (shim.logging() && symbol != nullptr &&
      (std::strncmp(symbol, "cuMem", 5) == 0 || std::strncmp(symbol, "cuPointer", 9) == 0 ||
       std::strncmp(symbol, "cuIpc", 5) == 0))
    shim.log("passing through %s (not served)", symbol);
  return fn;
}

}  // namespace cuarena::shim

// Any other name, and RTLD_NEXT for any name, goes to libc's dlsym by a tail call, so that libc
// sees the caller's return address: RTLD_NEXT then means "after the caller", and dlerror() names
// the caller's object, as without the shim. (RTLD_NEXT keeps its answer for served names too: an
// interposer preloaded after the shim that forwards to the next cudaMalloc must reach the real
// one, not the shim's hook, or the two would call each other. The optimize attribute keeps the
// sibling call in unoptimised builds.)
extern "C" __attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"),
                          no_sanitize("address"))) void*
dlsym(void* handle, const char* name) noexcept {
  void* hook = handle == RTLD_NEXT ? nullptr : hook_by_name(name);
  // (A noexcept function may tail-call only a noexcept one.)
  if (hook == nullptr)
    return reinterpret_cast<void* (*)(void*, const char*) noexcept>(libc_dlsym())(handle, name);
  // The hook only where the name resolves at all (a probe of another library gets its NULL).
  return real_dlsym(handle, name) != nullptr ? hook : nullptr;
}

CUARENA_HOOK CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags,
                                          CUdriverProcAddressQueryResult* symbolStatus) {
  const CUresult r = real_get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = substitute(symbol, *pfn);
  return r;
}

CUARENA_HOOK CUresult cuarena_cuGetProcAddress_v1(const char* symbol, void** pfn, int cudaVersion,
                                                  cuuint64_t flags) {
  using Fn = CUresult (*)(const char*, void**, int, cuuint64_t);
  static const Fn real =
      reinterpret_cast<Fn>(libcuda() ? real_dlsym(libcuda(), "cuGetProcAddress") : nullptr);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = substitute(symbol, *pfn);
  return r;
}

CUARENA_HOOK cudaError_t
cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                        enum cudaDriverEntryPointQueryResult* driverStatus) {
  using Fn =
      cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
  static const Fn real = reinterpret_cast<Fn>(real_runtime("cudaGetDriverEntryPoint"));
  if (real == nullptr) return cudaErrorInitializationError;
  const cudaError_t r = real(symbol, funcPtr, flags, driverStatus);
  if (r == cudaSuccess && funcPtr != nullptr) *funcPtr = substitute(symbol, *funcPtr);
  return r;
}

CUARENA_HOOK cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* driverStatus) {
  using Fn = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                             cudaDriverEntryPointQueryResult*);
  static const Fn real = reinterpret_cast<Fn>(real_runtime("cudaGetDriverEntryPointByVersion"));
  if (real == nullptr) return cudaErrorInitializationError;
  const cudaError_t r = real(symbol, funcPtr, cudaVersion, flags, driverStatus);
  if (r == cudaSuccess && funcPtr != nullptr) *funcPtr = substitute(symbol, *funcPtr);
  return r;
}
