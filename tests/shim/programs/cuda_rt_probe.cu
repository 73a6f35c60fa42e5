// cuda_rt_probe: the runtime API calls the shim interposes, each with its error code and name,
// printed without addresses or memory sizes so that runs with and without
// LD_PRELOAD=libcuarena_preload.so can be compared exactly. Built twice: with the static cudart
// (its calls reach the driver only through dlopen/dlsym of libcuda.so.1 and cuGetProcAddress)
// and with the shared one (its cudaMalloc & co. are looked up in the global scope, where the
// shim's exports come first). The test runs it where no GPU is visible.
#include <cuda_runtime.h>

#include <cstdio>

__global__ void touch(int* p) {
  if (p) *p = 1;
}

static void report(const char* what, cudaError_t e) {
  std::printf("%s: %d %s\n", what, static_cast<int>(e), cudaGetErrorName(e));
}

int main() {
  int count = -1;
  report("cudaGetDeviceCount", cudaGetDeviceCount(&count));
  std::printf("device count: %d\n", count);

  int driver = -1;
  report("cudaDriverGetVersion", cudaDriverGetVersion(&driver));
  std::printf("driver version: %d\n", driver);

  void* p = nullptr;
  report("cudaMalloc(1 MiB)", cudaMalloc(&p, 1 << 20));
  std::printf("cudaMalloc pointer: %s\n", p ? "set" : "null");

  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes);
  report("cudaMemGetInfo", e);
  if (e == cudaSuccess)
    std::printf("free <= total: %s\n", free_bytes <= total_bytes ? "yes" : "no");

  touch<<<1, 1>>>(static_cast<int*>(p));
  report("kernel launch", cudaGetLastError());
  report("cudaDeviceSynchronize", cudaDeviceSynchronize());
  report("cudaFree", cudaFree(p));
  report("cudaFree(nullptr)", cudaFree(nullptr));

  void* q = nullptr;
  report("cudaMallocAsync(4 KiB)", cudaMallocAsync(&q, 4096, cudaStreamLegacy));
  std::printf("cudaMallocAsync pointer: %s\n", q ? "set" : "null");
  report("cudaFreeAsync", cudaFreeAsync(q, cudaStreamLegacy));

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  report("cudaGetDriverEntryPointByVersion(cuMemAlloc, 12000)",
         cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &status));
  std::printf("entry point status: %d, pointer: %s\n", static_cast<int>(status),
              fn ? "set" : "null");

  report("cudaGetLastError", cudaGetLastError());
  std::fprintf(stderr, "cuda_rt_probe: done\n");
  return 0;
}
