// libshim_gpu_broken_preload.so: a deliberately wrong LD_PRELOAD allocator, to show that the
// programs here catch what they claim to (tests/shim/gpu/run.sh runs some of them under it and
// requires them to FAIL). Not cuarena, and no part of the product.
//
// It exports cuarena_preload_version (so --expect-shim passes and only the behaviour checks can
// fail) and the shared cudart's cudaMalloc, cudaFree, cudaMallocAsync and cudaFreeAsync. They
// carve blocks out of one big cudaMalloc and hand the latest freed block that is large enough to
// the next request at once: no synchronisation, no stream order, no event (early reuse); the
// driver's view of a pointer (cuMemGetAddressRange, IPC handles) stays the whole pool's. Programs
// built with the static cudart never reach it. No CUDA header: the few runtime types are declared
// here.
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

extern "C" __attribute__((visibility("default"))) const char* cuarena_preload_version() {
  return "broken test double (tests/shim/gpu/broken_preload.cpp)";
}

namespace {

// cuda_runtime_api.h's, by value.
using cudaError_t = int;
using cudaStream_t = void*;
constexpr cudaError_t cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
                      cudaErrorInitializationError = 3;

constexpr std::size_t kPool = std::size_t{8} << 30;

struct Pool {
  std::mutex mu;
  char* base = nullptr;
  std::size_t used = 0;
  std::map<void*, std::size_t> sizes;  // every block handed out, live or freed
  std::vector<void*> freed;            // most recent last
};

Pool& pool() {
  static Pool p;
  return p;
}

cudaError_t take(void** out, std::size_t size) {
  size = (size + 255) / 256 * 256;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.base == nullptr) {
    using Malloc = cudaError_t (*)(void**, std::size_t);
    auto real = reinterpret_cast<Malloc>(dlsym(RTLD_NEXT, "cudaMalloc"));
    if (real == nullptr) return cudaErrorInitializationError;
    const cudaError_t e = real(reinterpret_cast<void**>(&p.base), kPool);
    if (e != cudaSuccess) return e;
  }
  for (std::size_t i = p.freed.size(); i-- > 0;) {
    if (p.sizes[p.freed[i]] >= size) {  // a freed block, whatever may still use it
      *out = p.freed[i];
      p.freed.erase(p.freed.begin() + std::ptrdiff_t(i));
      return cudaSuccess;
    }
  }
  if (p.used + size > kPool) return cudaErrorMemoryAllocation;
  *out = p.base + p.used;
  p.sizes[*out] = size;
  p.used += size;
  return cudaSuccess;
}

cudaError_t give(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.sizes.count(ptr) == 0) return cudaErrorInvalidValue;
  p.freed.push_back(ptr);
  return cudaSuccess;
}

}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT cudaError_t cudaMalloc(void** ptr, std::size_t size) { return take(ptr, size); }
EXPORT cudaError_t cudaFree(void* ptr) { return give(ptr); }
EXPORT cudaError_t cudaMallocAsync(void** ptr, std::size_t size, cudaStream_t) {
  return take(ptr, size);
}
EXPORT cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return give(ptr); }
