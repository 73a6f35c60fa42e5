#include "cuarena/driver_api.hpp"

#include <dlfcn.h>

#include "cuarena/errors.hpp"

namespace cuarena::cuda {

namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

// The default: libcuda.so.1's own cuGetProcAddress (the library is loaded once per process, so
// this finds the same driver any runtime in the process uses).
void* driver_resolve(const char* symbol, int cuda_version, std::uint64_t flags) {
  static const GetProcAddress get_proc = []() -> GetProcAddress {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    return reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress_v2"));
  }();
  if (get_proc == nullptr) return nullptr;
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (get_proc(symbol, &fn, cuda_version, flags, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS)
    return nullptr;
  return fn;
}

DriverResolver g_resolver = driver_resolve;

template <class Fn>
void resolve(Fn& fn, const char* symbol, int cuda_version, bool per_thread) {
  // Legacy-stream semantics unless the row is a per-thread variant: stream 0 is the legacy
  // default stream, as for the runtime's callers.
  fn = reinterpret_cast<Fn>(g_resolver(symbol, cuda_version,
                                       per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                  : CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  if (fn == nullptr) {
    throw BackendError(std::string("cuarena: driver entry point ") + symbol +
                       " not available (is libcuda.so.1, the NVIDIA driver, installed?)");
  }
}

}  // namespace

void set_driver_resolver(DriverResolver resolver) {
  g_resolver = resolver ? resolver : driver_resolve;
}

const DriverApi& DriverApi::get() {
  static const DriverApi api = [] {
    DriverApi a;
#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  CUARENA_DRIVER_IF(backend, resolve(a.member, #api, version, per_thread);)
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL
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
