// cuda_driver_probe: the driver API as XLA/JAX and cudart reach it: dlopen("libcuda.so.1") and
// dlsym on that handle. Prints "no libcuda" where the library is missing (CI); otherwise cuInit's
// result and what cuGetProcAddress_v2 answers, without addresses, so runs with and without
// LD_PRELOAD=libcuarena_preload.so compare exactly. No CUDA header: the few types are declared
// here, so this builds without the toolkit.
#include <dlfcn.h>

#include <cstdio>

using CUresult = int;
using cuInit_t = CUresult (*)(unsigned);
using cuDriverGetVersion_t = CUresult (*)(int*);
using cuGetProcAddress_v2_t = CUresult (*)(const char*, void**, int, unsigned long long, int*);

int main() {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) {
    std::printf("no libcuda\n");
    std::fprintf(stderr, "dlopen(libcuda.so.1): %s\n", dlerror());
    return 0;
  }
  std::printf("libcuda loaded\n");

  auto init = reinterpret_cast<cuInit_t>(dlsym(cuda, "cuInit"));
  std::printf("dlsym(cuInit): %s\n", init ? "found" : "missing");
  if (init) std::printf("cuInit(0) = %d\n", init(0));

  auto version = reinterpret_cast<cuDriverGetVersion_t>(dlsym(cuda, "cuDriverGetVersion"));
  if (version) {
    int v = -1;
    CUresult r = version(&v);
    std::printf("cuDriverGetVersion = %d, version %d\n", r, v);
  }

  auto gpa = reinterpret_cast<cuGetProcAddress_v2_t>(dlsym(cuda, "cuGetProcAddress_v2"));
  std::printf("dlsym(cuGetProcAddress_v2): %s\n", gpa ? "found" : "missing");
  if (gpa) {
    const char* const names[] = {"cuMemAlloc", "cuMemFree", "cuInit", "cuNoSuchEntryPoint"};
    for (const char* name : names) {
      void* fn = nullptr;
      int status = -1;
      CUresult r = gpa(name, &fn, 12000, 0, &status);
      std::printf("cuGetProcAddress_v2(%s, 12000) = %d, status %d, pointer %s\n", name, r, status,
                  fn ? "set" : "null");
    }
  }
  dlerror();
  void* missing = dlsym(cuda, "cuNoSuchFunction");
  std::printf("dlsym(cuNoSuchFunction): %s\n", missing ? "found" : "NULL");
  std::fprintf(stderr, "cuda_driver_probe: done\n");
  return 0;
}
