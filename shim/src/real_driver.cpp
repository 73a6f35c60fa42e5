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
#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  CUARENA_DRIVER_IF(shim, load(t.member, #abi);)
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL
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
