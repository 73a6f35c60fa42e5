// vmm_costs: what each CUDA virtual-memory driver call costs on this GPU, per call, for one
// physical handle of 1..1024 granules, against one cuMemAlloc/cuMemFree of the same size.
// The figures decide how cuarena's VMM backend should size its physical chunks (the design:
// allocator/README.md; the figures: docs/results.md). Run on a GPU machine:
// build-gpu/bin/cuarena_vmm_costs
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <vector>

#include "cuarena/driver_api.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::puts("cuarena_vmm_costs: no CUDA device; run on a GPU machine");
    return 0;
  }
  cudaFree(nullptr);  // create the primary context
  const auto& api = cuarena::cuda::DriverApi::get();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t g = 0;
  cuarena::cuda::check(api.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                       "cuMemGetAllocationGranularity");
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va = 0;
  cuarena::cuda::check(api.address_reserve(&va, 2048 * g, g, 0, 0), "cuMemAddressReserve");
  std::printf("granule %zu KiB; microseconds per call (second of two repetitions)\n", g >> 10);
  std::printf("%9s %10s %8s %10s %8s %9s %12s %10s\n", "granules", "create", "map", "setaccess",
              "unmap", "release", "cudaMalloc", "cudaFree");
  for (int n : {1, 10, 32, 256, 1024}) {
    double t_create = 0, t_map = 0, t_set = 0, t_unmap = 0, t_rel = 0, t_malloc = 0, t_free = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first repetition warms the driver's paths up
      CUmemGenericAllocationHandle h = 0;
      auto t = Clock::now();
      cuarena::cuda::check(api.mem_create(&h, n * g, &prop, 0), "cuMemCreate");
      t_create = us_since(t);
      t = Clock::now();
      cuarena::cuda::check(api.mem_map(va, n * g, 0, h, 0), "cuMemMap");
      t_map = us_since(t);
      t = Clock::now();
      cuarena::cuda::check(api.mem_set_access(va, n * g, &access, 1), "cuMemSetAccess");
      t_set = us_since(t);
      t = Clock::now();
      cuarena::cuda::check(api.mem_unmap(va, n * g), "cuMemUnmap");
      t_unmap = us_since(t);
      t = Clock::now();
      cuarena::cuda::check(api.mem_release(h), "cuMemRelease");
      t_rel = us_since(t);
      void* p = nullptr;
      t = Clock::now();
      if (cudaMalloc(&p, n * g) != cudaSuccess) return 1;
      t_malloc = us_since(t);
      t = Clock::now();
      cudaFree(p);
      t_free = us_since(t);
    }
    std::printf("%9d %10.1f %8.1f %10.1f %8.1f %9.1f %12.1f %10.1f\n", n, t_create, t_map, t_set,
                t_unmap, t_rel, t_malloc, t_free);
  }
  // Can one cuMemUnmap (or cuMemSetAccess) span several mappings? 8 single-granule handles,
  // each mapped with its own cuMemMap side by side.
  constexpr int kRun = 8;
  std::vector<CUmemGenericAllocationHandle> hs(kRun);
  for (auto& h : hs) cuarena::cuda::check(api.mem_create(&h, g, &prop, 0), "cuMemCreate");
  auto map_all = [&] {
    for (int i = 0; i < kRun; ++i)
      cuarena::cuda::check(api.mem_map(va + i * g, g, 0, hs[i], 0), "cuMemMap");
  };
  map_all();
  auto t = Clock::now();
  const CUresult set_one = api.mem_set_access(va, kRun * g, &access, 1);
  const double t_set_one = us_since(t);
  t = Clock::now();
  for (int i = 0; i < kRun; ++i) cuarena::cuda::check(api.mem_unmap(va + i * g, g), "cuMemUnmap");
  const double t_unmap_each = us_since(t);
  map_all();
  t = Clock::now();
  const CUresult unmap_one = api.mem_unmap(va, kRun * g);
  const double t_unmap_one = us_since(t);
  if (unmap_one != CUDA_SUCCESS) {
    for (int i = 0; i < kRun; ++i) api.mem_unmap(va + i * g, g);
  }
  std::printf(
      "%d granules mapped one by one: one cuMemSetAccess over all: %s (%.1f us); "
      "cuMemUnmap each: %.1f us in all; one cuMemUnmap over all: %s (%.1f us)\n",
      kRun, set_one == CUDA_SUCCESS ? "ok" : "refused", t_set_one, t_unmap_each,
      unmap_one == CUDA_SUCCESS ? "ok" : "refused", t_unmap_one);
  for (auto h : hs) api.mem_release(h);
  api.address_free(va, 2048 * g);
  return 0;
}
