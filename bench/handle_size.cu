// Does the size of the physical handles behind a range change how fast kernels read it?
//
// cuarena backs memory with cuMemCreate handles mapped into reserved ranges: memory first makes
// every 2 MiB granule its own handle, whole chunks one handle of up to 128 MiB. This maps the
// same bytes from handles of 2 MiB to 512 MiB (and from cudaMalloc), in address order and with
// the 2 MiB handles mapped in a shuffled physical order, and times on each a streaming copy and
// a random 4-byte gather over the whole range (what a TLB would feel), with CUDA events, median
// of 9 runs.
//
//   cmake --build build --target cuarena_handle_size && build/bin/cuarena_handle_size [GiB]
//   (or: nvcc -O2 -arch=sm_90 -o handle_size bench/handle_size.cu -lcuda)
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    CUresult r_ = (x);                                                               \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char* s_ = nullptr;                                                      \
      cuGetErrorString(r_, &s_);                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
#define CR(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__global__ void copy(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

__global__ void gather(const unsigned* __restrict__ in, unsigned* out, size_t n, int rounds) {
  unsigned acc = 0;
  size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * 2654435761u % n;
  for (int r = 0; r < rounds; ++r) {
    unsigned v = in[i];
    acc += v;
    i = (i * 6364136223846793005ull + 1442695040888963407ull + v) % n;
  }
  if (acc == 0xdeadbeef) out[0] = acc;
}

struct Range {
  CUdeviceptr ptr = 0;
  size_t size = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

Range map_range(size_t bytes, size_t handle, bool shuffle, int dev) {
  Range r;
  r.size = bytes;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CK(cuMemAddressReserve(&r.ptr, bytes, 1 << 30, 0, 0));
  const size_t n = bytes / handle;
  r.handles.resize(n);
  for (auto& h : r.handles) CK(cuMemCreate(&h, handle, &prop, 0));
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (shuffle) std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (size_t i = 0; i < n; ++i)
    CK(cuMemMap(r.ptr + i * handle, handle, 0, r.handles[order[i]], 0));
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(r.ptr, bytes, &acc, 1));
  return r;
}

void unmap_range(Range& r) {
  CK(cuMemUnmap(r.ptr, r.size));
  for (auto h : r.handles) CK(cuMemRelease(h));
  CK(cuMemAddressFree(r.ptr, r.size));
}

template <class F>
float median_ms(F&& launch) {
  cudaEvent_t a, b;
  CR(cudaEventCreate(&a));
  CR(cudaEventCreate(&b));
  launch();
  std::vector<float> ms;
  for (int i = 0; i < 9; ++i) {
    CR(cudaEventRecord(a));
    launch();
    CR(cudaEventRecord(b));
    CR(cudaEventSynchronize(b));
    float t = 0;
    CR(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CR(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void measure(const char* name, char* base, size_t bytes, unsigned* sink) {
  const size_t half = bytes / 2;
  CR(cudaMemset(base, 1, bytes));
  const float c = median_ms([&] {
    copy<<<132 * 8, 512>>>(reinterpret_cast<const float4*>(base),
                           reinterpret_cast<float4*>(base + half), half / sizeof(float4));
  });
  const float g = median_ms([&] {
    gather<<<132 * 16, 256>>>(reinterpret_cast<const unsigned*>(base), sink,
                              bytes / sizeof(unsigned), 64);
  });
  std::printf("%-28s copy %7.3f ms (%6.0f GB/s)   random gather %7.3f ms\n", name, c,
              2.0 * half / c / 1e6, g);
}

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 8;
  const size_t bytes = gib << 30;
  CR(cudaSetDevice(0));
  CR(cudaFree(nullptr));
  CK(cuInit(0));
  unsigned* sink = nullptr;
  CR(cudaMalloc(&sink, 4));
  {
    char* p = nullptr;
    CR(cudaMalloc(&p, bytes));
    measure("cudaMalloc", p, bytes, sink);
    CR(cudaFree(p));
  }
  for (size_t mib : {2, 4, 8, 32, 128, 512}) {
    for (bool shuffle : {false, true}) {
      if (shuffle && mib != 2) continue;
      Range r = map_range(bytes, mib << 20, shuffle, 0);
      char name[64];
      std::snprintf(name, sizeof name, "handles of %zu MiB%s", mib, shuffle ? ", shuffled" : "");
      measure(name, reinterpret_cast<char*>(r.ptr), bytes, sink);
      unmap_range(r);
    }
  }
  return 0;
}
